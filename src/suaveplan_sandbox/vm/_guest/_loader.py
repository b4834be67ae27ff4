"""Host side: read a plugin (file or package) and have the fork server check and compile it;
the check itself (`check_plugin_module`: AST-check a module and its imports).

The host only reads: `load_plugin` bounds, decodes and digests the sources and never parses
them, because CPython's parser costs far more memory than the source's size (a 4 MiB
`x = [a,a,...]` takes 2.7 GB). The check runs where the bundle is compiled, in a
short-lived child of the fork server with capped memory and CPU (`vm._compile_child`), and
the fork server keeps the result by the bundle's digest, so creating many sandboxes of one
plugin reads its files each time but parses and checks them once.
Any change to a file changes the digest and is checked afresh. The digest covers every
module's name, file name, source and kind, and whether the interpreter layer applies, the
only input of the check besides the module constants of `_policy`; a new option that
changes the verdict must join it.
"""

from __future__ import annotations

import ast
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from suaveplan_sandbox._untrusted_files import UnreadableFile, read_regular_file
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._guest._policy import (
    ALLOWED_MODULES,
    IO_NAMES,
    SUAVEPLAN_NAMES,
    check_module,
)

_MAX_SOURCE = 4 * 1024 * 1024
# A package is read whole into the host and sent to the fork server in one request, so its
# sources together stay within one source's bound, and the walk looks at no more than this
# many folder entries (files, folders, anything) before refusing: an archive of a million
# empty files or folders must not keep the host busy or hold its memory.
_MAX_BUNDLE_SOURCE = _MAX_SOURCE
_MAX_ENTRIES = 10_000

_ACCEPTED_KINDS = (".py file", "package folder with __init__.py")


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginModule:
    name: str
    filename: str
    source: str
    is_package: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginBundle:
    name: str
    digest: str
    entry: str
    modules: tuple[PluginModule, ...]
    # False only in the test-only process-layer-alone run (see `load_plugin`).
    interpreter_layer: bool = True

    def to_wire(self) -> dict[str, object]:
        return {
            "name": self.name,
            "digest": self.digest,
            "entry": self.entry,
            "interpreter_layer": self.interpreter_layer,
            "modules": [
                {
                    "name": m.name,
                    "filename": m.filename,
                    "source": m.source,
                    "is_package": m.is_package,
                }
                for m in self.modules
            ],
        }

    @classmethod
    def from_wire(cls, data: object) -> PluginBundle:
        bad = SuaveplanError("SAND_WIRE_ERROR", "malformed plugin bundle", {"reason": "bad-bundle"})
        if not isinstance(data, dict):
            raise bad
        mods = data.get("modules")
        name, digest, entry = data.get("name"), data.get("digest"), data.get("entry")
        layer = data.get("interpreter_layer", True)
        if not (
            isinstance(name, str)
            and isinstance(digest, str)
            and isinstance(entry, str)
            and isinstance(mods, list)
            and isinstance(layer, bool)
        ):
            raise bad
        out = []
        for m in mods:
            if not isinstance(m, dict):
                raise bad
            mn, fn, src, pkg = (
                m.get("name"),
                m.get("filename"),
                m.get("source"),
                m.get("is_package"),
            )
            if not (
                isinstance(mn, str)
                and isinstance(fn, str)
                and isinstance(src, str)
                and isinstance(pkg, bool)
            ):
                raise bad
            out.append(PluginModule(name=mn, filename=fn, source=src, is_package=pkg))
        modules = tuple(out)
        if _digest(modules, layer) != digest or entry not in {m.name for m in modules}:
            raise bad
        return cls(name=name, digest=digest, entry=entry, modules=modules, interpreter_layer=layer)


def _digest(modules: tuple[PluginModule, ...], interpreter_layer: bool = True) -> str:
    h = hashlib.sha256()
    if not interpreter_layer:
        # A distinct cache key: the fork server must never serve an unchecked compilation
        # for a checked request of the same source.
        h.update(b"process-layer-only\0")
    for m in sorted(modules, key=lambda m: m.name):
        for part in (m.name, m.filename, m.source, "1" if m.is_package else "0"):
            b = part.encode()
            h.update(len(b).to_bytes(8, "big") + b)
    return h.hexdigest()


def resolve_import(  # noqa: PLR0917
    module: str,
    level: int,
    names: tuple[str, ...],
    current: str,
    is_package: bool,
    known: set[str],
    top: str,
) -> list[str]:
    """Plugin-internal module names an import needs; raise if it leaves the allowlist."""
    if level == 0:
        root = module.split(".", maxsplit=1)[0]
        if module in ALLOWED_MODULES:
            if module == "suaveplan" and any(n not in SUAVEPLAN_NAMES for n in names):
                raise LookupError(module)
            if module == "io" and any(n not in IO_NAMES for n in names):
                raise LookupError(module)
            return []
        if root == top and root in known:
            raise LookupError(module)  # absolute self-import: use relative imports
        raise LookupError(module)
    base = current.split(".") if is_package else current.split(".")[:-1]
    if level - 1 > len(base) - 1:
        raise LookupError("." * level + module)
    if level > 1:
        base = base[: len(base) - (level - 1)]
    target = ".".join([*base, *([module] if module else [])])
    needed = []
    if target in known:
        needed.append(target)
        for n in names:
            sub = f"{target}.{n}"
            if sub in known:
                needed.append(sub)
        return needed
    raise LookupError("." * level + module)


def load_plugin(
    plugin_module_path: str | os.PathLike[str], *, _without_interpreter_layer: bool = False
) -> PluginBundle:
    """Read a plugin and have the fork server check and compile it (`ForkServer.load`),
    unless it holds it already; the plugin's refusal is raised with its code. The sources
    are bounded, decoded and digested here, never parsed (see the module docstring).

    The path the host names is followed if it is a link; inside a package folder nothing
    may be one (a `.py` file or folder that is a link is SAND_INVALID_ARGUMENT, reason
    `symlink`): the package's contents are the author's, and a link would have the host
    read its own files into the plugin. Every source must be a regular file, read as
    UTF-8 text (an encoding cookie is a comment: the checked text is the compiled text).
    A package is bounded as a whole (`_MAX_ENTRIES`, `_MAX_BUNDLE_SOURCE`).

    `_without_interpreter_layer` is test-only (the escape corpus's process-layer-alone run):
    only read here; the fork server compiles the source (at the fork) without the AST or
    import check, and the worker runs it with the real builtins (and logs a warning that it
    does). Only the escape corpus
    harness passes it; no public API, CLI option, plugin or manifest value reaches it.
    """
    path = Path(plugin_module_path)
    modules: list[PluginModule] = []
    if path.is_dir():
        if not (path / "__init__.py").is_file():
            raise SuaveplanError(
                "SAND_INVALID_ARGUMENT",
                "plugin folder lacks __init__.py",
                {"file": str(path), "accepted": list(_ACCEPTED_KINDS)},
            )
        top = path.name
        modules = _read_package(path, top)
        entry = top
    elif path.is_file() and path.suffix == ".py":
        top = path.stem
        modules.append(
            PluginModule(
                name=top, filename=path.name, source=_read(path, path.name), is_package=False
            )
        )
        entry = top
    else:
        # Not an import decision: the host handed us something that is not a plugin at all.
        raise SuaveplanError(
            "SAND_INVALID_ARGUMENT",
            "plugin path is not a .py file or a package folder with __init__.py",
            {"file": str(path), "accepted": list(_ACCEPTED_KINDS)},
        )
    _check_names(modules)
    layer = not _without_interpreter_layer
    mods = tuple(modules)
    bundle = PluginBundle(
        name=top, digest=_digest(mods, layer), entry=entry, modules=mods, interpreter_layer=layer
    )
    if layer:
        # Host side only (the fork server never loads a plugin): imported here, not at the
        # top, because the fork server imports this module.
        from suaveplan_sandbox.vm._zygote import fork_server

        fork_server().load(bundle)
    return bundle


def check_plugin_module(m: PluginModule, known: set[str], top: str) -> ast.Module:
    """AST-check one plugin module and every import it makes; returns the checked tree.

    Used by `compile_bundle`, in the fork server's limited compile child only: the host
    never parses plugin source.
    """
    try:
        tree, imports = check_module(m.source, m.filename)
    except (RecursionError, MemoryError):
        raise too_complex(m.filename) from None
    for module, level, names, node in imports:
        try:
            resolve_import(module, level, names, m.name, m.is_package, known, top)
        except LookupError as exc:
            raise SuaveplanError(
                "SAND_VM_MODULE_IMPORT_FORBIDDEN",
                "import is not allowed",
                {
                    "module": str(exc.args[0]),
                    "file": m.filename,
                    "line": getattr(node, "lineno", 0),
                },
            ) from None
    return tree


def too_complex(filename: str) -> SuaveplanError:
    """The error for source nested too deeply to parse, check or compile. Python's parser
    raises `MemoryError` for some nesting (its own stack) and `RecursionError` for other;
    the checker is recursive, so an expression nested a few hundred deep (a sum of ~300
    terms) is past the interpreter's recursion limit. Either is the plugin's input, told
    apart from the host's failures by a code."""
    return SuaveplanError(
        "SAND_VM_SYNTAX_FORBIDDEN",
        "plugin source is nested too deeply to check",
        {"file": filename, "reason": "too-deeply-nested"},
    )


def _read_package(path: Path, top: str) -> list[PluginModule]:
    """Every module of the package folder `path`, in path order.

    Only package folders (with an `__init__.py`) are entered, never through a link: each
    folder is opened relative to its parent's descriptor with O_NOFOLLOW, so a folder
    swapped for a link after it was listed is refused rather than followed. Hidden entries
    and `__pycache__` are skipped (a shipped `.pyc` is never read). Bounded by
    `_MAX_ENTRIES` entries looked at and `_MAX_BUNDLE_SOURCE` bytes read in all.
    """
    modules: list[PluginModule] = []
    room = [_MAX_ENTRIES, _MAX_BUNDLE_SOURCE]  # entries, bytes still allowed
    root = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the host's path
    # An explicit stack, not recursion: descriptors chain folders deeper than PATH_MAX.
    stack: list[tuple[int, tuple[str, ...], list[str]]] = []
    try:
        stack.append((root, (), _listing(root, (), room)))
        while stack:
            fd, rel, names = stack[-1]
            if not names:
                stack.pop()
                os.close(fd)
                continue
            name = names.pop()
            parts = (*rel, name)
            shown = str(Path(*parts))
            if name.endswith(".py"):
                # A link named like a module (to a file or a folder) is refused outright.
                source = _read(name, shown, follow=False, dir_fd=fd, room=room)
                mod = [top, *rel] + ([] if name == "__init__.py" else [name[:-3]])
                modules.append(
                    PluginModule(
                        name=".".join(mod),
                        filename=shown,
                        source=source,
                        is_package=name == "__init__.py",
                    )
                )
                continue
            sub = _package_folder(fd, name)
            if sub is not None:
                try:
                    listing = _listing(sub, parts, room)
                except BaseException:
                    os.close(sub)
                    raise
                stack.append((sub, parts, listing))
    finally:
        for fd, _, _ in stack:
            os.close(fd)
    return modules


def _listing(fd: int, rel: tuple[str, ...], room: list[int]) -> list[str]:
    """A folder's usable names, in reverse order (popped from the end: path order)."""
    names: list[str] = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                room[0] -= 1
                if room[0] < 0:
                    raise _unreadable(str(Path(*rel)) if rel else ".", "too-many-files")
                if not (entry.name.startswith(".") or entry.name == "__pycache__"):
                    names.append(entry.name)
    except OSError:
        raise _unreadable(str(Path(*rel)) if rel else ".", "unreadable") from None
    return sorted(names, reverse=True)


def _package_folder(parent: int, name: str) -> int | None:
    """A descriptor of `name` if it is a real folder (not a link) holding `__init__.py`.

    Not `adapters._beneath.open_directory` (what `BeneathRootFs` and the WASM preopens share)
    on purpose: this walk lists a tree from descriptors it already holds, so each step is one
    name beneath its parent and one `O_NOFOLLOW` open is all of "not through a link" (no path
    to resolve, nothing for `openat2` to save), and any failure means "not a package
    folder", skipped rather than told apart: `_beneath` would spend an `lstat` on every plain
    file here to name a link it is going to skip anyway."""
    try:
        fd = os.open(
            name,
            os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            dir_fd=parent,
        )
    except OSError:
        return None  # a file, a link, or gone: not a package folder of this plugin
    try:
        is_package = stat.S_ISREG(os.stat("__init__.py", dir_fd=fd).st_mode)
    except OSError:
        is_package = False
    if not is_package:
        os.close(fd)
        return None
    return fd


def _read(
    file: Path | str,
    shown: str,
    *,
    follow: bool = True,
    dir_fd: int | None = None,
    room: list[int] | None = None,
) -> str:
    """One plugin source: a regular file (never a FIFO or device, which could block or
    never end), read up to one byte past the size bound. `follow=False`: the file itself
    must not be a symbolic link (O_NOFOLLOW, so a link swapped in after the walk's check
    is refused too). The plugin path the host names is followed. `room`: the bytes the
    package still has (`[entries, bytes]`, updated), checked as the file is read."""
    limit = _MAX_SOURCE if room is None else min(_MAX_SOURCE, room[1])
    try:
        data = read_regular_file(file, limit, follow=follow, dir_fd=dir_fd)
    except UnreadableFile as exc:
        raise _unreadable(shown, exc.reason) from None
    if len(data) > limit:
        alone = len(data) > _MAX_SOURCE
        raise SuaveplanError(
            "SAND_VM_SYNTAX_FORBIDDEN",
            "plugin source too large" if alone else "plugin sources too large together",
            {
                "file": _shown(shown),
                "reason": "too-large" if alone else "sources-too-large",
                "limit": _MAX_SOURCE,
            },
        )
    if room is not None:
        room[1] -= len(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SuaveplanError(
            "SAND_VM_SYNTAX_FORBIDDEN",
            "plugin source is not UTF-8",
            {"file": _shown(Path(file).name), "line": data.count(b"\n", 0, exc.start) + 1},
        ) from None


def _unreadable(shown: str, reason: str) -> SuaveplanError:
    return SuaveplanError(
        "SAND_INVALID_ARGUMENT",
        "plugin file cannot be used",
        {"file": _shown(shown), "reason": reason},
    )


def _shown(name: str) -> str:
    """A file name as text that encodes (undecodable bytes replaced), for error details."""
    return os.fsencode(name).decode("utf-8", "replace")


def _check_names(modules: list[PluginModule]) -> None:
    """Module and file names must be text (a name from undecodable bytes can be neither
    hashed nor sent to the worker, nor imported)."""
    for m in modules:
        try:
            m.name.encode()
            m.filename.encode()
        except UnicodeEncodeError:
            raise SuaveplanError(
                "SAND_INVALID_ARGUMENT",
                "plugin file name is not UTF-8",
                {"file": _shown(m.filename)},
            ) from None
