"""Host side: read a plugin (file or package), AST-check every module, check its imports.

The check is a pure function of the sources and their names, so a bundle that passed is
remembered by its content digest (`_CHECKED`): creating many sandboxes of one plugin reads
its files each time but parses and checks them once. Any change to a file changes the
digest and is checked afresh. The digest covers every module's name, file name, source and
kind, and whether the interpreter layer applies, the only input of the check besides the
module constants of `_policy`; a new option that changes the verdict must join it.
"""

from __future__ import annotations

import ast
import errno
import hashlib
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import final

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._guest._policy import (
    ALLOWED_MODULES,
    IO_NAMES,
    SUAVEPLAN_NAMES,
    check_module,
)

_MAX_SOURCE = 4 * 1024 * 1024

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


@final
class _CheckedBundles:
    """Bundles that passed the checks, by digest: at most `max_entries` of them holding at
    most `max_chars` of names and source in all (a bigger bundle is never kept); the least
    recently used go first."""

    def __init__(self, *, max_entries: int, max_chars: int) -> None:
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._bundles: dict[str, tuple[PluginBundle, int]] = {}
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._bundles)

    @property
    def chars(self) -> int:
        return self._chars

    def get(self, digest: str) -> PluginBundle | None:
        with self._lock:
            hit = self._bundles.pop(digest, None)
            if hit is None:
                return None
            self._bundles[digest] = hit  # most recently used: last
            return hit[0]

    def add(self, bundle: PluginBundle) -> None:
        size = sum(len(m.name) + len(m.filename) + len(m.source) for m in bundle.modules)
        if size > self.max_chars:
            return
        with self._lock:
            if bundle.digest in self._bundles:
                return
            while self._bundles and (
                len(self._bundles) >= self.max_entries or self._chars + size > self.max_chars
            ):
                _, dropped = self._bundles.pop(next(iter(self._bundles)))
                self._chars -= dropped
            self._bundles[bundle.digest] = (bundle, size)
            self._chars += size


_CHECKED = _CheckedBundles(max_entries=256, max_chars=64 * 1024 * 1024)


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
    """Read and check a plugin.

    The path the host names is followed if it is a link; inside a package folder nothing
    may be one (a `.py` file or folder that is a link is SAND_INVALID_ARGUMENT, reason
    `symlink`): the package's contents are the author's, and a link would have the host
    read its own files into the plugin. Every source must be a regular file.

    `_without_interpreter_layer` is test-only (the escape corpus's process-layer-alone run):
    no AST or import check, and the worker runs the source with the real builtins (and logs
    a warning that it does). Only the escape corpus harness passes it; no public API, CLI
    option, plugin or manifest value reaches it.
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
        for file in sorted(path.rglob("*.py")):
            rel = file.relative_to(path)
            if any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
                continue
            if not all(
                (path / Path(*rel.parts[:i]) / "__init__.py").is_file()
                for i in range(len(rel.parts))
            ):
                continue
            parts = [top, *rel.with_suffix("").parts]
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            # The package's own contents: a link in it is the author's, not the host's, and
            # would read a host file (a settings.py, a quoted .env) into the plugin.
            if any((path / Path(*rel.parts[: i + 1])).is_symlink() for i in range(len(rel.parts))):
                raise _unreadable(str(rel), "symlink")
            source = _read(file, str(rel), follow=False)
            modules.append(
                PluginModule(
                    name=".".join(parts), filename=str(rel), source=source, is_package=is_pkg
                )
            )
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
    digest = _digest(mods, layer)
    cached = _CHECKED.get(digest)
    if cached is not None:
        return cached
    if layer:
        known = {m.name for m in modules}
        for m in modules:
            check_plugin_module(m, known, top)
    bundle = PluginBundle(
        name=top, digest=digest, entry=entry, modules=mods, interpreter_layer=layer
    )
    _CHECKED.add(bundle)
    return bundle


def check_plugin_module(m: PluginModule, known: set[str], top: str) -> ast.Module:
    """AST-check one plugin module and every import it makes; returns the checked tree.

    Used at load (host) and again before compiling (worker): never trust the wire.
    """
    tree, imports = check_module(m.source, m.filename)
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


def _read(file: Path, shown: str, *, follow: bool = True) -> str:
    """One plugin source: a regular file (never a FIFO or device, which could block or
    never end), read up to one byte past the size bound. `follow=False`: the file itself
    must not be a symbolic link (O_NOFOLLOW, so a link swapped in after the walk's check
    is refused too). The plugin path the host names is followed."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(file, flags)
    except OSError as exc:
        raise _unreadable(
            shown, "symlink" if exc.errno == errno.ELOOP and not follow else "unreadable"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _unreadable(shown, "not-a-regular-file")
        chunks: list[bytes] = []
        size = 0
        while size <= _MAX_SOURCE and (chunk := os.read(fd, _MAX_SOURCE + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        raise _unreadable(shown, "unreadable") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > _MAX_SOURCE:
        raise SuaveplanError(
            "SAND_VM_SYNTAX_FORBIDDEN", "plugin source too large", {"file": _shown(file.name)}
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SuaveplanError(
            "SAND_VM_SYNTAX_FORBIDDEN",
            "plugin source is not UTF-8",
            {"file": _shown(file.name), "line": data.count(b"\n", 0, exc.start) + 1},
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
