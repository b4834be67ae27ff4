"""Filesystem rules: lexical path normalisation and `*` matching against the policy root.

Pure code. A requested path is resolved lexically against the root (the plugin sees the root
as `/`); climbing above the root is denied, never clamped. `*` matches any run of characters
including `/`. Rules are indexed by the directory part of their literal prefix (the text before
the first `*`), so a check costs O(path depth), not O(rules).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, final

from suaveplan_sandbox.permissions import _accel
from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason, new_allow
from suaveplan_sandbox.permissions._glob import compile_glob

MAX_PATH_BYTES: Final = 4096
MAX_SEGMENT_BYTES: Final = 255
_WRITE_PREFIX: Final = "rw:"
_CACHE_ENTRIES: Final = 4096
_CACHED_PATH_CHARS: Final = 512
_normpath: Final = posixpath.normpath


class FsRuleError(ValueError):
    """A malformed fs rule, raised when the rule set is built."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(f"fs rule {index}: {message}")
        self.index = index
        self.message = message


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Preopen:
    """How one rule maps to a WASI preopen; `directory=None` means it cannot be expressed."""

    rule: str
    index: int
    directory: str | None
    writable: bool


def _check_limits(path: str) -> bool:
    if "\0" in path:
        return False
    if len(path) <= MAX_SEGMENT_BYTES and path.isascii():
        return True  # the common case: short ASCII is within every byte limit
    try:
        raw = path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    if len(raw) > MAX_PATH_BYTES:
        return False
    return len(raw) <= MAX_SEGMENT_BYTES or all(
        len(segment) <= MAX_SEGMENT_BYTES for segment in raw.split(b"/")
    )


def normalize_request_path(path: object) -> str | DenyReason:
    """The root-relative lexical form of `path` (`"."` for the root), or why it is refused."""
    if type(path) is not str or not path:
        return DenyReason.INVALID_PATH
    # `_check_limits`, with its common case inlined (this is the uncached check's hot path).
    if "\0" in path or not (
        (len(path) <= MAX_SEGMENT_BYTES and path.isascii()) or _check_limits(path)
    ):
        return DenyReason.INVALID_PATH
    # posixpath.normpath keeps leading `..` for relative input, so any climb above the root
    # (even one a later segment comes back from) shows up as a leading `..`.
    normal = _normpath(path.lstrip("/") or ".")
    if normal[0] == "." and (normal == ".." or normal.startswith("../")):
        return DenyReason.PATH_NOT_IN_ALLOWLIST
    return normal


@final
@dataclass(frozen=True, slots=True)
class _Rule:
    index: int
    text: str
    pattern: str  # normalised, root-relative ("." for the root)
    writable: bool
    glob: bool  # `pattern` has a `*`; otherwise the rule is an exact match on it
    # The glob's full-match test; None for exact rules and for `dir/*` subtrees, which need
    # none (see `_entry`).
    fullmatch: Callable[[str], object] | None


def _glob_or_directory(pattern: str) -> Callable[[str], object]:
    """`a*/*`: the directories `a*` matches as well as everything beneath them."""
    beneath, itself = compile_glob(pattern), compile_glob(pattern[:-2])

    def fullmatch(target: str) -> object:
        return itself(target) or beneath(target)

    return fullmatch


def _is_subtree(pattern: str) -> bool:
    return pattern.endswith("/*") and "*" not in pattern[:-2]


def _compile_rule(index: int, text: object) -> _Rule:
    if type(text) is not str:
        raise FsRuleError(index, "rule must be a string")
    body = text[len(_WRITE_PREFIX) :] if text.startswith(_WRITE_PREFIX) else text
    writable = body is not text
    if not body:
        raise FsRuleError(index, "rule is empty")
    if "\0" in body:
        raise FsRuleError(index, "rule contains a NUL byte")
    if body.startswith("/"):
        raise FsRuleError(index, "rule must be relative to the root (e.g. ./uploads/*)")
    if len(body.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise FsRuleError(index, "rule is longer than 4096 bytes")
    segments = [s for s in body.split("/") if s not in ("", ".")]
    if ".." in segments:
        raise FsRuleError(index, "rule must not contain '..'")
    if any(len(s.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES for s in segments):
        raise FsRuleError(index, "rule has a segment longer than 255 bytes")
    pattern = "/".join(segments) or "."
    if "*" not in pattern:
        return _Rule(index, text, pattern, writable, False, None)
    if _is_subtree(pattern):
        return _Rule(index, text, pattern, writable, True, None)
    # `./*` grants the root (".") too: a bare `*` matches every target already.
    matcher = _glob_or_directory(pattern) if pattern.endswith("/*") else compile_glob(pattern)
    return _Rule(index, text, pattern, writable, True, matcher)


def _bucket_key(pattern: str) -> str:
    """Directory part of the literal prefix: every path the rule matches is at or below it."""
    literal = pattern.split("*", 1)[0]
    if pattern.endswith("/*") and literal == pattern[:-1]:
        return literal[:-1]  # `dir/*` also matches `dir`
    slash = literal.rfind("/")
    return literal[:slash] if slash >= 0 else "."


# Denials carry no request data, so each reason needs exactly one instance.
_DENIALS: Final = {reason: Deny(capability="fs", reason=reason) for reason in DenyReason}
_DENY_MODE: Final = _DENIALS[DenyReason.MODE_NOT_PERMITTED]
_DENY_OUTSIDE: Final = _DENIALS[DenyReason.PATH_NOT_IN_ALLOWLIST]
_DENY_INVALID: Final = _DENIALS[DenyReason.INVALID_PATH]

# (index, fullmatch or None, writable, verbatim text): tuples keep the hot loop cheap. None
# marks a `dir/*` rule (no other `*`): it lives in bucket `dir`, and the walk in `_best` only
# visits that bucket for `dir` itself or a path below `dir/`, all of which the rule matches, so
# it needs no test at all. That is the commonest rule shape.
_Entry = tuple[int, Callable[[str], object] | None, bool, str]


def _entry(rule: _Rule) -> _Entry:
    # A glob's own test (None for a `dir/*` subtree); an exact rule compares equal.
    fullmatch = rule.fullmatch if rule.glob else rule.pattern.__eq__
    return (rule.index, fullmatch, rule.writable, rule.text)


@final
class FsRuleSet:
    """Compiled fs rules. `check` returns `Allow(rule, target)` or `Deny("fs", reason)`."""

    __slots__ = (
        "_exact",
        "_first_glob",
        "_globs",
        "_matcher",
        "_read_cache",
        "_root_globs",
        "_rules",
        "_subtree_heads",
        "_write_cache",
        "rules",
    )

    def __init__(self, rules: Sequence[str]) -> None:
        self.rules: tuple[str, ...] = tuple(rules)
        compiled = [_compile_rule(i, text) for i, text in enumerate(self.rules)]
        self._rules = tuple(compiled)
        exact: dict[str, list[_Rule]] = {}
        globs: dict[str, list[_Rule]] = {}
        for rule in compiled:
            if not rule.glob:
                exact.setdefault(rule.pattern, []).append(rule)
            else:
                globs.setdefault(_bucket_key(rule.pattern), []).append(rule)
        self._exact = {k: tuple(_entry(r) for r in v) for k, v in exact.items()}
        self._globs = {k: tuple(_entry(r) for r in v) for k, v in globs.items()}
        # Lowest glob index: once the best match is at or below it, no other glob can win.
        self._root_globs = "." in self._globs
        self._first_glob = min((r.index for v in globs.values() for r in v), default=-1)
        # Rules `head*` with their one star last (`dir/*`, `*`, `dir/a*`): every path that
        # starts with `head` matches, so a listing under such a head needs no per-name test.
        self._subtree_heads = tuple(
            r.pattern[:-1] for r in compiled if r.glob and r.pattern.find("*") == len(r.pattern) - 1
        )
        # Decisions are a pure function of (rules, path, mode) and immutable, so a bounded
        # memo of recent short paths per mode is safe; guests tend to touch the same few files.
        self._read_cache: dict[str, Allow | Deny] = {}
        self._write_cache: dict[str, Allow | Deny] = {}
        # The C twin of `check` over these same tables and memos, when it is built.
        matcher = _accel.fs_matcher()
        self._matcher = (
            None
            if matcher is None
            else matcher(
                exact=self._exact,
                globs=self._globs,
                root_globs=self._root_globs,
                first_glob=self._first_glob,
                read_cache=self._read_cache,
                write_cache=self._write_cache,
                denials=_DENIALS,
                deny_mode=_DENY_MODE,
                deny_outside=_DENY_OUTSIDE,
                deny_invalid=_DENY_INVALID,
                allow_type=Allow,
                normalize=normalize_request_path,
                cache_entries=_CACHE_ENTRIES,
                cached_chars=_CACHED_PATH_CHARS,
            )
        )

    @property
    def fast_check(self) -> Callable[[object, object], Allow | Deny]:
        """`check`, in C when the accelerator is built (same decisions, same memo)."""
        return self.check if self._matcher is None else self._matcher.check

    def _decide(self, target: str, write: bool) -> Allow | Deny:
        """The decision for a normalised `target`: the lowest-index rule that matches it and
        grants the mode wins; a match that only lacks the mode is `mode-not-permitted`."""
        best: _Entry | None = None
        matched = False
        for entry in self._exact.get(target, ()):
            matched = True
            if not write or entry[2]:
                best = entry
                break
        globs = self._globs
        first = self._first_glob
        if globs and (best is None or best[0] > first):
            # Buckets at the root, at each ancestor directory and at the target itself (the
            # root's bucket is looked up only if there is one: most policies have none).
            if self._root_globs:
                key = "."
                slash = -1
            else:
                slash = target.find("/")
                key = target if slash < 0 else target[:slash]
            while True:
                bucket = globs.get(key)
                if bucket is not None:
                    for entry in bucket:
                        if best is not None and entry[0] > best[0]:
                            break
                        fullmatch = entry[1]
                        if fullmatch is None or fullmatch(target) is not None:
                            matched = True
                            if not write or entry[2]:
                                best = entry
                                break
                    if best is not None and best[0] == first:
                        break  # nothing deeper can be lower
                if key is target or target == ".":
                    break
                slash = target.find("/", slash + 1)
                key = target if slash < 0 else target[:slash]
        if best is not None:
            return new_allow(best[3], target)
        return _DENY_MODE if matched else _DENY_OUTSIDE

    def check(self, path: object, mode: object = "read") -> Allow | Deny:
        """The decision for `path` in `mode` ("read" or "write"). This is the reference
        implementation; `fast_check` is the same decision, in C when available."""
        if mode == "read":
            write = False
            cache = self._read_cache
        elif mode == "write":
            write = True
            cache = self._write_cache
        else:
            return _DENY_MODE
        if type(path) is not str:
            return _DENY_INVALID
        hit = cache.get(path)
        if hit is not None:
            return hit
        target = normalize_request_path(path)
        decision = (
            _DENIALS[target] if isinstance(target, DenyReason) else self._decide(target, write)
        )
        if len(path) <= _CACHED_PATH_CHARS:
            if len(cache) >= _CACHE_ENTRIES:
                cache.clear()
            cache[path] = decision
        return decision

    def readable_entries(self, directory: str, names: Iterable[object]) -> list[str]:
        """The `names` listed in `directory` (a normalised target, as `check` returns it) that
        the rules let the plugin read, sorted: a listing never names an entry no rule covers.

        Read access to the directory itself is the caller's check; a rule about the directory
        (`./data`) or about some files in it (`./data/*.csv`, which also matches a directory
        `data/x.csv`) covers only what it matches. A name that is not one plain entry (not a
        str, empty, `.`, `..`, holding `/` or NUL, past the length limits, not UTF-8) is never
        a path a request could name, so it is left out as well. No denial is counted: nothing
        was requested.
        """
        prefix = "" if directory == "." else directory + "/"
        # A `head*` rule covers every child of `directory` when the children's common prefix
        # starts with `head`; the names then only need to be plain entries.
        covered = any(prefix.startswith(head) for head in self._subtree_heads)
        decide = self._decide
        out: list[str] = []
        for name in names:
            if type(name) is not str or not name or name in {".", ".."} or "/" in name:
                continue
            target = prefix + name
            if not _check_limits(target):  # NUL, or too long for any request to name
                continue
            if covered or type(decide(target, False)) is Allow:
                out.append(name)
        out.sort()
        return out

    def preopens(self) -> tuple[Preopen, ...]:
        """One entry per rule: `dir/*` preopens `dir` (`*` the root). A rule naming a
        directory exactly (`dir/`) grants that one path, not what is beneath it, so like a
        file it preopens nothing: a preopen would hand a guest all of `dir`."""
        out: list[Preopen] = []
        for rule in self._rules:
            directory: str | None = None
            if rule.pattern == "*":
                directory = "."
            elif _is_subtree(rule.pattern):
                directory = rule.pattern[:-2]
            out.append(
                Preopen(
                    rule=rule.text, index=rule.index, directory=directory, writable=rule.writable
                )
            )
        return tuple(out)
