"""Worker-only interpreter sealing: shared classes become immutable before plugin code runs.

Why: facades hand the guest real classes (`dataclasses.Field`, `json.JSONEncoder`,
`enum.Enum`, `SuaveplanError`, ...), and a plain `Cls.attr = value` statement needs no guarded
builtin. The worker's own trusted code uses several of them after the plugin has run: it
serialises errors with `SuaveplanError.to_wire`, builds protocol dataclasses, decodes fetch
bodies with `json`. A patched method would run guest code inside those paths and let the
guest choose what the trusted code sends. Copying every class would break `isinstance`
against values made by the stdlib, so instead every pure-Python class in the modules the
guest or the worker's trusted code can reach (bound to a module name or not), and every
exception class of any module (the guest catches them), gets CPython's `Py_TPFLAGS_IMMUTABLETYPE`
(the flag static types such as `int` carry): `type.__setattr__`/`__delattr__` then raise
`TypeError` for everyone in this process. Classes the plugin defines later are unaffected.

Irreversible and process-wide, so it runs only in the fork server before it forks (workers
inherit it for free) or, as a fallback, in a hardened worker; never in the host or a test
process.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterable
from typing import Final

_IMMUTABLETYPE: Final = 1 << 8
_HEAPTYPE: Final = 1 << 9
# x86_64/aarch64 CPython 3.11-3.13: tp_flags follows 21 pointer-sized PyTypeObject fields.
_TP_FLAGS_OFFSET: Final = 21 * ctypes.sizeof(ctypes.c_void_p)

# Module name prefixes whose classes are sealed: the facade modules (and their submodules,
# e.g. json.decoder), what they are built on, and everything the worker's own code runs.
SEALED_MODULE_PREFIXES: Final = (
    # builtins' own pure classes (ExceptionGroup: `ExceptionGroup.derive = ...` ran plugin
    # code wherever an except* split a group); static builtins are immutable already.
    "builtins",
    # copy.Error reaches the guest as a caught exception (dataclasses.asdict deep-copies).
    "copy",
    "json",
    "math",
    "cmath",
    "re",
    "datetime",
    "_pydatetime",
    "decimal",
    "_pydecimal",
    "fractions",
    "numbers",
    "statistics",
    "random",
    "itertools",
    "functools",
    "collections",
    "_collections_abc",
    # typing's ContextManager aliases hand out its ABCs, and the worker's own code runs
    # `contextlib.contextmanager` (a property set on the ABC ran plugin code there).
    "contextlib",
    "dataclasses",
    "enum",
    "typing",
    "abc",
    # Classes C modules make as heap types, handed out by values: `_abc._abc_data` (an ABC's
    # own `_abc_impl`), `time.struct_time` (`datetime.timetuple()`).
    "_abc",
    "time",
    "textwrap",
    "base64",
    "binascii",
    "hashlib",
    "hmac",
    "uuid",
    "csv",
    "io",
    "_pyio",
    "urllib",
    "string",
    "types",
    "unicodedata",
    "socket",
    "selectors",
    "msgpack",
    "suaveplan_sandbox",
)


def _flags_address(cls: type) -> int:
    return id(cls) + _TP_FLAGS_OFFSET


def _in_sealed_module(cls: type) -> bool:
    name = cls.__dict__.get("__module__")
    return isinstance(name, str) and any(
        name == p or name.startswith(p + ".") for p in SEALED_MODULE_PREFIXES
    )


def _all_classes() -> list[type]:
    """Every class alive in this process, through the subclass lists (bound to a name or not)."""
    out: dict[int, type] = {}
    todo: list[type] = [object]
    while todo:
        subclasses: list[type] = type.__subclasses__(todo.pop())
        for sub in subclasses:
            if id(sub) not in out:
                out[id(sub)] = sub
                todo.append(sub)
    return list(out.values())


def _classes_in(module_names: Iterable[str]) -> list[type]:
    seen: dict[int, type] = {}

    def add(value: type) -> None:
        for cls in (*value.__mro__, type(value)):
            seen.setdefault(id(cls), cls)

    for name in module_names:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        for value in list(vars(mod).values()):
            if isinstance(value, type):
                add(value)
    # Classes a module defines without binding them to a module name reach the guest through
    # values: `type(decimal.getcontext().flags)` (SignalDict, made by _decimal with module
    # "abc"), `type(enum.auto().value)` (the class of enum's `_auto_null` sentinel). And any
    # module's exception class reaches it as a caught exception (copy.Error,
    # _hashlib.UnsupportedDigestmodError from hmac): no trusted code patches either kind.
    for cls in _all_classes():
        if _in_sealed_module(cls) or issubclass(cls, BaseException):
            add(cls)
    return list(seen.values())


def _sealed_modules() -> list[str]:
    return [
        name
        for name in list(sys.modules)
        if any(name == p or name.startswith(p + ".") for p in SEALED_MODULE_PREFIXES)
    ]


def shared_classes() -> list[type]:
    """The classes defined in the sealed modules, and every exception class: the ones a guest
    can be handed (sealing also covers their bases and metaclasses)."""
    return [
        cls
        for cls in _classes_in(_sealed_modules())
        if _in_sealed_module(cls) or issubclass(cls, BaseException)
    ]


_prepared = False


def is_sealed(cls: type) -> bool:
    return bool(cls.__flags__ & _IMMUTABLETYPE)


def is_prepared() -> bool:
    """True once `seal_shared_classes` ran in this process (inherited across fork)."""
    return _prepared


def seal_shared_classes() -> int:
    """Mark every heap class in the sealed modules immutable; returns how many changed.

    Raises RuntimeError (the worker then exits before any plugin code runs) if this
    interpreter's type layout is not the one the offset was written for.
    """
    global _prepared  # noqa: PLW0603 - once per process, inherited by forks
    if sys.implementation.name != "cpython" or not (3, 11) <= sys.version_info[:2] <= (3, 13):
        raise RuntimeError("class sealing supports CPython 3.11-3.13 only")
    pythonapi = ctypes.pythonapi
    pythonapi.PyType_Modified.argtypes = (ctypes.py_object,)
    pythonapi.PyType_Modified.restype = None
    changed = 0
    for cls in _classes_in(_sealed_modules()):
        flags = cls.__flags__
        if not flags & _HEAPTYPE or flags & _IMMUTABLETYPE:
            continue
        cell = ctypes.c_ulong.from_address(_flags_address(cls))
        if cell.value != flags:
            raise RuntimeError(f"unexpected type layout for {cls!r}; refusing to run unsealed")
        cell.value = flags | _IMMUTABLETYPE
        pythonapi.PyType_Modified(cls)
        changed += 1
    _prepared = True
    return changed
