"""Worker side: compile a checked bundle, build frozen builtins and facades, run the plugin.

Design: checks are compile-time (see `_policy`); at runtime only `getattr`-family builtins,
`type()`, `.format`, `_private` attributes (`_guards`, skipped for `self` of a pure plugin
class), class creation and imports are guarded, plus the stdlib guards of `_guards`.
Facades keep their contents out of reach of plain attribute access (`__getattribute__`
serves only the curated mapping).
"""

from __future__ import annotations

import ast
import builtins as _b
import contextlib
import dataclasses as _dataclasses
import functools
import importlib
import json as _json
import sys
import types
import typing as _typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._guest._guards import (
    PLUGIN_CLASSES,
    PLUGIN_MODULES,
    build_plugin_class,
    check_dataclass_fields,
    check_match_args,
    g_attr_hook,
    g_class_stamp,
    g_dunder_def,
    g_private,
    g_pure,
    guarded_fields,
    guarded_replace,
    install_stdlib_guards,
    mark_plugin_class,
    private_ok,
    refuse_metaclass,
    refuse_metaclass_bases,
    refuse_metaclass_hooks,
)
from suaveplan_sandbox.vm._guest._guards import __file__ as _guards_file
from suaveplan_sandbox.vm._guest._lazy_imports import C_IMPLICIT_IMPORTS, preload_lazy_imports
from suaveplan_sandbox.vm._guest._loader import PluginBundle, check_plugin_module, too_complex
from suaveplan_sandbox.vm._guest._policy import (
    ALLOWED_MODULES,
    DIRECT_EVAL,
    FORMAT_ATTRS,
    GUARD_ATTR_HOOK,
    GUARD_CLASS_STAMP,
    GUARD_DUNDER_DEF,
    GUARD_FORMAT,
    GUARD_PRIVATE,
    GUARD_PURE,
    OWNED_ONLY_ATTRS,
    check_format_string,
    is_forbidden_attr,
    is_guarded_attr,
    is_owned_only_attr,
    norm,
)
from suaveplan_sandbox.vm._guest._policy import __file__ as _policy_file
from suaveplan_sandbox.vm._guest._seal import (
    is_prepared,
    is_sealed,
    seal_shared_classes,
    shared_classes,
)
from suaveplan_sandbox.vm._hardening import arm_cpu_backstop, hardening_was_applied

_MAX_DEPTH: Final = 64
# Distinct topics one plugin may subscribe to. The host subscribes each on its bus when the
# sandbox is created, and a bus scans its subscriptions on every publish: without a bound a
# plugin subscribing to `orders.0` ... `orders.199999` (each within an `orders.*` grant) cost
# the host 17 s and 110 MB to create, and every publisher on the bus 40 ms a publish.
MAX_SUBSCRIPTIONS: Final = 256
# Reachable through a module facade, these would evaluate strings or run subprocesses.
_FACADE_EXCLUDED: Final = frozenset(
    {
        # Command-line entry points (`base64.main`/`test`, `uuid.main` on
        # 3.12+, `random.main` on 3.13): trusted code using the real `print`, `open`, `sys.argv`
        # and imports on the plugin's behalf, writing to the host's stdout.
        "main",
        "test",
        "get_type_hints",
        "global_enum",  # writes members into sys.modules[cls.__module__] (module= is guest-chosen)
        # A pickling hook returning `(getattr, (cls, name))`: its `getattr` is the real one.
        "pickle_by_enum_name",
        "ForwardRef",
        "evaluate_forward_ref",
        "get_annotations",
        "singledispatch",
        "singledispatchmethod",
        "make_dataclass",
        "getnode",
        "uuid1",
    }
)
_DANGEROUS_TYPES: Final = frozenset(
    {
        types.FunctionType,
        types.CodeType,
        types.FrameType,
        types.GeneratorType,
        types.CoroutineType,
        types.AsyncGeneratorType,
        types.TracebackType,
        types.MethodType,
        types.ModuleType,
        types.CellType,
        types.BuiltinFunctionType,
        types.MappingProxyType,
        # A cache's own class builds a cache from its four arguments, `typed` included (see
        # `_g_lru_cache`).
        _b.type(functools.lru_cache()(abs)),
    }
)
_SAFE_BUILTINS: Final = (
    "abs",
    "all",
    "any",
    "ascii",
    "bin",
    "bool",
    "bytearray",
    "bytes",
    "callable",
    "chr",
    "classmethod",
    "complex",
    "dict",
    "divmod",
    "enumerate",
    "filter",
    "float",
    "format",
    "frozenset",
    "hash",
    "hex",
    "id",
    "int",
    "isinstance",
    "issubclass",
    "iter",
    "len",
    "list",
    "map",
    "max",
    "min",
    "next",
    "object",
    "oct",
    "ord",
    "pow",
    "property",
    "range",
    "repr",
    "reversed",
    "round",
    "set",
    "slice",
    "sorted",
    "staticmethod",
    "str",
    "sum",
    "super",
    "tuple",
    "zip",
    "memoryview",
    "NotImplemented",
    "Ellipsis",
    "None",
    "True",
    "False",
)


class Facade:
    """A read-only namespace: attribute reads serve a curated mapping; writes raise."""

    __slots__ = ("_sp_content", "_sp_label")

    def __init__(self, label: str, content: Mapping[str, object]) -> None:
        object.__setattr__(self, "_sp_content", types.MappingProxyType(dict(content)))
        object.__setattr__(self, "_sp_label", label)

    def __getattribute__(self, name: str) -> Any:
        content = object.__getattribute__(self, "_sp_content")
        try:
            return content[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise SuaveplanError("SAND_VM_GLOBALS_FROZEN", "facades are read-only")

    def __delattr__(self, name: str) -> NoReturn:
        raise SuaveplanError("SAND_VM_GLOBALS_FROZEN", "facades are read-only")

    def __repr__(self) -> str:
        return f"<facade {object.__getattribute__(self, '_sp_label')}>"


def _frozen(value: object) -> object:
    """A facade's mutable container (urllib.parse's scheme lists, hashlib's algorithm sets,
    typing.EXCLUDED_ATTRIBUTES that the Protocol guard relies on) as a read-only copy: the
    module's own stays as trusted code sees it."""
    if type(value) is list:
        return tuple(value)
    if type(value) is set:
        return frozenset(value)
    if type(value) is dict:
        return types.MappingProxyType(dict(value))
    return value


def _typing_plain(value: object) -> object:
    if value is _b.type:
        return GuardedType
    if type(value) is tuple:
        return tuple(_typing_plain(v) for v in value)
    if type(value) is list:
        return [_typing_plain(v) for v in value]
    return value


def _g_get_origin(tp: object) -> object:
    # `typing.get_origin(typing.Type)` is the real `type`.
    return _typing_plain(_typing.get_origin(tp))


def _g_get_args(tp: object) -> object:
    return _typing_plain(_typing.get_args(tp))


_MODULE_FACADES: dict[str, Facade] = {}
# id(facade) -> the real module it stands for; read only by trusted code (dataclasses).
_FACADE_MODULES: dict[int, types.ModuleType] = {}


def _check_wrapper_args(wrapper: object, assigned: Any, updated: Any) -> None:
    # update_wrapper is a generic getattr/setattr: custom `assigned` names (or a wrapper with
    # its own __setattr__) would read any dunder, e.g. a host function's __globals__.
    if (
        tuple(assigned) != functools.WRAPPER_ASSIGNMENTS
        or tuple(updated) != functools.WRAPPER_UPDATES
        or not isinstance(wrapper, types.FunctionType)
    ):
        raise SuaveplanError(
            "SAND_VM_ATTRIBUTE_FORBIDDEN",
            "functools.update_wrapper/wraps only with the default names, on a function",
        )


def _g_update_wrapper(
    wrapper: object,
    wrapped: object,
    assigned: Any = functools.WRAPPER_ASSIGNMENTS,
    updated: Any = functools.WRAPPER_UPDATES,
) -> object:
    _check_wrapper_args(wrapper, assigned, updated)
    out: object = functools.update_wrapper(wrapper, wrapped, updated=())  # type: ignore[arg-type]
    _copy_readable_dict(wrapper, wrapped)
    return out


def _copy_readable_dict(wrapper: object, wrapped: object) -> None:
    """update_wrapper's `wrapper.__dict__.update(wrapped.__dict__)`, for the names the guest
    could read on `wrapped` itself. The wrapper is the plugin's function, whose `_private`
    attributes are its own: copying a foreign class's dict there handed out its private
    members as the plugin's (`ForwardRef._evaluate`, which `eval`s with the real builtins)."""
    state = getattr(wrapped, "__dict__", None)
    if state is None:
        return
    target = wrapper.__dict__
    for key, value in dict(state).items():
        if type(key) is not str or norm(key) != key or is_forbidden_attr(key):
            continue
        if is_guarded_attr(key) and not private_ok(wrapped, key):
            continue
        target[key] = value


def _g_wraps(
    wrapped: object,
    assigned: Any = functools.WRAPPER_ASSIGNMENTS,
    updated: Any = functools.WRAPPER_UPDATES,
) -> Callable[[object], object]:
    _check_wrapper_args(_g_wraps, assigned, updated)

    def decorate(wrapper: object) -> object:
        return _g_update_wrapper(wrapper, wrapped)

    return decorate


# What the plugin itself created (classes through `__build_class__`, its modules): their
# `_private` attributes are the plugin's own (see `_guards.private_ok`).
_PLUGIN_CLASSES = PLUGIN_CLASSES
_PLUGIN_MODULES = PLUGIN_MODULES


def _build_class(func: Callable[..., object], name: str, *bases: object, **kw: object) -> object:
    refuse_metaclass_bases(bases, GuardedType)
    cls = build_plugin_class(func, name, *bases, **kw)
    if isinstance(cls, _b.type):
        refuse_metaclass(cls, GuardedType)
        refuse_metaclass_hooks(cls)
        mark_plugin_class(cls)
        _guard_subclasshook(cls)
        # Inherited dataclass fields and match arguments are read natively by name: on
        # this class they must still resolve to the plugin's own attributes.
        check_dataclass_fields(cls)
        check_match_args(cls)
    return cls


def _is_typing_proto_hook(hook: object) -> bool:
    """typing's own `__subclasshook__` for Protocols (3.12+: one classmethod; 3.11: a closure
    `Protocol.__init_subclass__` makes for each Protocol)."""
    if hook is getattr(_typing, "_proto_hook", None):
        return True
    code = hook.__code__ if type(hook) is types.FunctionType else None
    return (
        code is not None and code.co_name == "_proto_hook" and code.co_filename == _typing.__file__
    )


def _guard_subclasshook(cls: type) -> None:
    """ABCMeta calls `cls.__subclasshook__(C)` for every class C that any code checks with
    `isinstance`/`issubclass` against the ABC or one of its superclasses (`isinstance(int,
    Probe)` passes the real `type`; a check in trusted code, any class it tests): the plugin's
    hook saw classes the guarded `type()` refuses, e.g. `type` itself, whose three-argument
    call builds a class from any namespace. Its hook now sees only what `type()` hands out;
    for anything else the check goes on as if it had answered NotImplemented."""
    hook = cls.__dict__.get("__subclasshook__")
    if hook is None or _is_typing_proto_hook(hook):
        return
    bind = getattr(_b.type(hook), "__get__", None)

    def __subclasshook__(klass: type, sub: object) -> object:
        if not _type_handed_out(sub):
            return NotImplemented
        return (bind(hook, None, klass) if bind is not None else hook)(sub)

    _b.type.__setattr__(cls, "__subclasshook__", classmethod(__subclasshook__))


@contextlib.contextmanager
def _plugin_module_visible(cls: object) -> Iterator[None]:
    """Let `dataclasses` find the plugin's module in sys.modules while it decorates `cls`.

    dataclasses resolves string annotations (ClassVar/InitVar) through
    `sys.modules[cls.__module__]`; plugin modules are never left there (a later lazy import
    of the same name by trusted code would get plugin code). A name that a real module has
    or could have is never shadowed, not even for the duration of the call.
    """
    name = getattr(cls, "__module__", None)
    # An exact `str`, used as read: a `str` subclass's own `__hash__`/`__eq__` would run in
    # the lookups below, and its `__str__` could name one module for the checks and another
    # for `sys.modules`.
    if type(name) is not str:
        yield
        return
    mod = _PLUGIN_MODULES.get(name)
    if (
        mod is None
        or not isinstance(cls, _b.type)
        or cls not in _PLUGIN_CLASSES
        or name in sys.modules
        or name.split(".")[0] in sys.stdlib_module_names
    ):
        yield
        return
    # What dataclasses reads: the plugin's globals with each module facade swapped for the
    # module it stands for (`"typing.ClassVar[int]"` is recognised by module identity). Only
    # trusted code reads sys.modules; the plugin's own globals are untouched.
    view = types.ModuleType(name)
    view.__dict__.update(
        {
            k: _FACADE_MODULES.get(id(v), v) if isinstance(v, Facade) else v
            for k, v in vars(mod).items()
        }
    )
    sys.modules[name] = view
    try:
        yield
    finally:
        if sys.modules.get(name) is view:
            del sys.modules[name]


def _g_dataclass(cls: object = None, /, **kwargs: Any) -> object:
    def wrap(c: object) -> object:
        if not isinstance(c, _b.type):
            # An instance can answer `__mro__`, `__dict__` and `__annotations__` itself
            # (properties), and dataclasses then made fields of its text unchecked, read
            # their defaults natively (`format`: the unguarded `str.format`) and wrote
            # `__dataclass_fields__` into its real dict.
            raise SuaveplanError(
                "SAND_VM_ATTRIBUTE_FORBIDDEN", "dataclass() applies to classes only"
            )
        # Before dataclasses pastes the names into the source it execs and reads each
        # one with getattr(c, name) for a default (a foreign `_evaluate`, `str.format`).
        own = c.__dict__.get("__annotations__", {})  # noqa: RUF063 - the class's own
        check_dataclass_fields(c, tuple(own) if isinstance(own, dict) else ("?",))
        with _plugin_module_visible(c):
            out: object = _dataclasses.dataclass(c, **kwargs)
        if isinstance(out, _b.type) and c in _PLUGIN_CLASSES:
            if out is not c:
                mark_plugin_class(out)  # slots=True builds a new class
            own_args = out.__dict__.get("__match_args__")
            if isinstance(own_args, tuple) and any(
                isinstance(n, str) and is_guarded_attr(n) and n not in OWNED_ONLY_ATTRS
                for n in own_args
            ):
                # Positional patterns over private fields: a class pattern would read them
                # natively from any subject the class admits. (A field named `obj` keeps its
                # pattern: only an instance holds it, checked below like any match_args.)
                if kwargs.get("match_args"):
                    raise SuaveplanError(
                        "SAND_VM_ATTRIBUTE_FORBIDDEN",
                        "match_args=True with a private or formatting field name",
                    )
                _b.type.__delattr__(out, "__match_args__")
            check_match_args(out)
        return out

    return wrap if cls is None else wrap(cls)


# Dunder members a runtime_checkable Protocol may declare: special methods whose presence is
# already observable through ordinary operations (len(), iter(), with, calls, arithmetic).
# Anything else (`__globals__`, `__wrapped__`, `_private`...) would make isinstance() an
# attribute-existence oracle on foreign objects, run by typing with the real hasattr().
PROTOCOL_MEMBERS_ALLOWED: Final = frozenset(
    {
        *(f"__{n}__" for n in ("call", "len", "iter", "next", "reversed", "contains")),
        *(f"__{n}__" for n in ("getitem", "setitem", "delitem", "missing", "hash", "bool")),
        *(f"__{n}__" for n in ("int", "float", "complex", "bytes", "index", "abs", "round")),
        *(f"__{n}__" for n in ("enter", "exit", "aenter", "aexit", "aiter", "anext", "await")),
        *(f"__{n}__" for n in ("str", "repr", "format", "eq", "ne", "lt", "le", "gt", "ge")),
        *(f"__{n}__" for n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow")),
        *(f"__{n}__" for n in ("neg", "pos", "invert", "and", "or", "xor", "init")),
    }
)


def check_protocol_members(cls: object) -> None:
    if not isinstance(cls, _b.type) or not getattr(cls, "_is_protocol", False):
        return
    attrs = set(_typing._get_protocol_attrs(cls))  # type: ignore[attr-defined]
    # 3.12+ checks the members typing listed when the class was made (`__protocol_attrs__`),
    # not the class's names now: a private member the plugin deleted since still counts.
    stored = cls.__dict__.get("__protocol_attrs__")
    if isinstance(stored, (set, frozenset)):
        attrs |= stored
    for attr in attrs:
        n = norm(str(attr))
        if (n.startswith("_") or is_forbidden_attr(n)) and n not in PROTOCOL_MEMBERS_ALLOWED:
            raise SuaveplanError(
                "SAND_VM_ATTRIBUTE_FORBIDDEN",
                "a Protocol checked at runtime may only declare public members",
            )


def _g_runtime_checkable(cls: object) -> object:
    check_protocol_members(cls)
    return _typing.runtime_checkable(cls)  # type: ignore[type-var]


_PROTOCOL_GUARD_INSTALLED = False


def install_protocol_guard() -> None:
    """Worker-only: isinstance/issubclass against any Protocol checks its members first.

    `runtime_checkable` is guarded in the facade, but a class body can set
    `_is_runtime_protocol = True` itself; the metaclass is where typing's hasattr() runs.
    """
    global _PROTOCOL_GUARD_INSTALLED  # noqa: PLW0603 - once per worker process
    if _PROTOCOL_GUARD_INSTALLED:
        return
    meta: Any = _b.type(_typing.Protocol)
    inst, sub = meta.__instancecheck__, meta.__subclasscheck__

    def instancecheck(cls: object, instance: object) -> bool:
        check_protocol_members(cls)
        return bool(inst(cls, instance))

    def subclasscheck(cls: object, other: object) -> bool:
        check_protocol_members(cls)
        return bool(sub(cls, other))

    meta.__instancecheck__ = instancecheck
    meta.__subclasscheck__ = subclasscheck
    _PROTOCOL_GUARD_INSTALLED = True


def _g_lru_cache(maxsize: Any = 128, typed: object = False) -> object:
    """`functools.lru_cache` without `typed=True`.

    A typed cache's key holds each argument's real class after the arguments, so for a class
    argument the real `type`; with keyword arguments it also holds the module's private
    marker, which shifts what lines up. When two keys of a dict hash alike, Python compares
    them element by element: `f(C, a, b)` and `f(q, k=x)` line `type` up with the plugin's
    `x`, whose `__eq__` got it. The plugin can compute both hashes: `hash(type)` from
    `hash(typing.Literal[C])` (a frozenset of `(C, type)`), the marker's (its address) by
    trying addresses near `id(functools.reduce)`, one cached call each, under a second; the
    unguarded `type()` builds a class from any namespace. Keys without `typed` hold no class,
    and typing's own typed caches are never called with keyword arguments, so their classes
    meet only classes (compared by identity: no metaclass the guest reaches defines
    `__eq__`). `typed` is read once, as a `bool`: a `__bool__` answering twice could differ."""
    if bool(typed):
        raise SuaveplanError(
            "SAND_VM_INDIRECT_EVAL_REJECTED",
            "functools.lru_cache(typed=True) is not available: its keys hold real classes",
        )
    return functools.lru_cache(maxsize, False)


_GUARDED_MEMBERS: Final[dict[str, dict[str, object]]] = {
    "functools": {
        "update_wrapper": _g_update_wrapper,
        "wraps": _g_wraps,
        "lru_cache": _g_lru_cache,
    },
    "dataclasses": {
        "dataclass": _g_dataclass,
        "fields": guarded_fields,
        "replace": guarded_replace,
    },
    "typing": {
        "runtime_checkable": _g_runtime_checkable,
        "get_origin": _g_get_origin,
        "get_args": _g_get_args,
    },
}


def module_facade(name: str) -> Facade:
    cached = _MODULE_FACADES.get(name)
    if cached is not None:
        return cached
    if name == "urllib":
        facade = Facade("urllib", {"parse": module_facade("urllib.parse")})
    else:
        mod = importlib.import_module(name)
        content = {
            k: _frozen(v)
            for k in dir(mod)
            if not k.startswith("_")
            and k not in _FACADE_EXCLUDED
            and not isinstance(v := getattr(mod, k), types.ModuleType)
            # A metaclass (enum.EnumType, typing.ABCMeta, ...) builds a class from any
            # namespace when called with three arguments, dunders included; a type `type()`
            # refuses (`dataclasses.FunctionType` on 3.11-3.12) is no facade name either.
            and not (isinstance(v, _b.type) and (issubclass(v, _b.type) or v in _DANGEROUS_TYPES))
        }
        if name == "io":
            content = {k: content[k] for k in ("StringIO", "BytesIO")}
        content.update(_GUARDED_MEMBERS.get(name, {}))
        facade = Facade(name, content)
        _FACADE_MODULES[id(facade)] = mod
    _MODULE_FACADES[name] = facade
    return facade


def _rejected(code: str) -> Callable[..., NoReturn]:
    def rejected(*args: object, **kwargs: object) -> NoReturn:
        raise SuaveplanError(code, "dynamic code execution is not available")

    return rejected


_indirect = _rejected("SAND_VM_INDIRECT_EVAL_REJECTED")


def _check_name(name: object, owner: object, store: bool = False) -> str:
    if not isinstance(name, str):
        raise TypeError("attribute name must be a string")
    n = norm(name)
    if is_forbidden_attr(n) or (is_owned_only_attr(n) and not private_ok(owner, n, store)):
        raise SuaveplanError("SAND_VM_ATTRIBUTE_FORBIDDEN", "attribute access is not allowed")
    return n


def _guarded_format(obj: object, attr: str) -> object:
    """`.format`/`.format_map`: whatever resolves to `str`'s own methods comes back guarded,
    bound (`"..".format`, a `str` subclass's instance, `super().format`) or unbound
    (`str.format`, a `str` subclass's or `StrEnum`'s)."""
    value = getattr(obj, attr)
    if value is str.format or value is str.format_map:
        method: Any = value

        def unbound(text: object, *args: object, **kwargs: object) -> str:
            if isinstance(text, str):
                check_format_string(text)
            return method(text, *args, **kwargs)  # type: ignore[no-any-return]

        return unbound
    text = getattr(value, "__self__", None)
    if (
        type(value) is types.BuiltinMethodType
        and isinstance(text, str)
        and value.__name__ in FORMAT_ATTRS
    ):
        bound = value

        def fmt(*args: object, **kwargs: object) -> str:
            check_format_string(text)
            return bound(*args, **kwargs)  # type: ignore[no-any-return]

        return fmt
    return value


_MISSING = object()


def _g_getattr(obj: object, name: object, default: object = _MISSING) -> object:
    n = _check_name(name, obj)
    if n in ("format", "format_map"):
        return _guarded_format(obj, n)
    if default is _MISSING:
        return getattr(obj, n)
    return getattr(obj, n, default)


def _g_hasattr(obj: object, name: object) -> bool:
    try:
        _g_getattr(obj, name)
    except (AttributeError, SuaveplanError):
        return False
    return True


def _g_setattr(obj: object, name: object, value: object) -> None:
    setattr(obj, _check_name(name, obj, store=True), value)


def _g_delattr(obj: object, name: object) -> None:
    delattr(obj, _check_name(name, obj, store=True))


def _type_handed_out(t: object) -> bool:
    """Whether the guarded `type()` hands out class `t`."""
    return (
        isinstance(t, _b.type)
        and t not in _DANGEROUS_TYPES
        and t is not Facade
        and not issubclass(t, _b.type)
    )


def _g_type(*args: object) -> object:
    if len(args) != 1:
        raise SuaveplanError(
            "SAND_VM_INDIRECT_EVAL_REJECTED", "type() with 3 arguments is not available"
        )
    t = type(args[0])
    if not _type_handed_out(t):
        raise SuaveplanError("SAND_VM_INDIRECT_EVAL_REJECTED", "that type is not available")
    return t


class _GuardedTypeMeta(type):
    """`type` for guests: one-argument calls are guarded; isinstance/issubclass work."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _b.type)

    def __subclasscheck__(cls, sub: object) -> bool:
        return isinstance(sub, _b.type) and issubclass(sub, _b.type)

    def __call__(cls, *args: object) -> object:
        return _g_type(*args)

    def __repr__(cls) -> str:
        return "<class 'type'>"


class GuardedType(metaclass=_GuardedTypeMeta):
    __slots__ = ()


def install_typing_type_guard() -> None:
    """Worker-only, before any plugin runs: `typing.Type`'s origin becomes `GuardedType`.

    `typing.Type` held the real `type` as its origin, and typing compares an origin with
    objects the guest chooses: `class C(typing.Type[int], obj)` runs `__mro_entries__`,
    which tests `self.__origin__ not in bases`, so `obj.__eq__` was handed the real `type`
    (whose three-argument call builds a class from any namespace); `_GenericAlias.__eq__`
    compares origins the same way. The guest's `type` keeps `typing.Type[X]`'s meaning
    (`isinstance(int, typing.Type)` holds; subclassing it is refused like subclassing
    `type`). typing's caches are cleared so that no alias made before keeps the real one.
    Irreversible and process-wide."""
    alias: Any = _typing.Type  # noqa: UP006 - the alias object itself
    if alias.__origin__ is _b.type:
        alias.__origin__ = GuardedType
    for clear in getattr(_typing, "_cleanups", ()):
        clear()


def install_statistics_guard() -> None:
    """Worker-only, before any plugin runs: statistics coerces only to classes `type()`
    hands out.

    statistics groups its data by the real `type`, coerces the classes it found to one
    (`_coerce`, once per class: `reduce(_coerce, types, int)`) and converts its exact total
    with that class (`_convert`: `T(value)`). A class in the data made the real `type` the
    target (a class whose static `as_integer_ratio`/`is_finite` call it "not finite" gets
    past the number checks), a plugin `int` subclass's arithmetic chose the total, and
    `mean()` returned the unguarded `type()` of any object: `types.FunctionType`, or
    `abc.ABCMeta`, which builds a class from any namespace. Any other class the guarded
    `type()` refuses would be called the same way. Such data is statistics' own error (a
    `TypeError`, as for any two classes it cannot coerce). Irreversible and process-wide."""
    statistics: Any = importlib.import_module("statistics")
    coerce = statistics._coerce
    if getattr(coerce, "_sp_guarded", False):
        return

    def _coerce(first: object, second: object) -> object:
        for cls in (first, second):
            if not _type_handed_out(cls):
                raise TypeError("statistics cannot convert to that type")
        return coerce(first, second)

    _coerce._sp_guarded = True  # type: ignore[attr-defined]
    statistics._coerce = _coerce


# What a function's code names when it computes an object's class: `x.__class__`, `type(x)`,
# `getattr(x, "__class__")`.
_CLASS_NAMES: Final = frozenset({"__class__", "type"})


def _computes_a_class(code: types.CodeType) -> bool:
    """Whether `code`, or code nested in it, reads `__class__` or names `type`."""
    if not _CLASS_NAMES.isdisjoint(code.co_names):
        return True
    return any(
        _computes_a_class(c) if type(c) is types.CodeType else type(c) is str and c == "__class__"
        for c in code.co_consts
    )


def _on_instances_only(func: types.FunctionType) -> types.FunctionType:
    """`func` (a trusted method) refusing a `self` whose class `type()` does not hand out."""

    def method(self: object, /, *args: object, **kwargs: object) -> object:
        if not _type_handed_out(_b.type(self)):
            raise TypeError(f"{func.__qualname__}() runs on an instance of its class only")
        return func(self, *args, **kwargs)

    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(method, name, getattr(func, name))
    return method  # type: ignore[return-value]


def _self_checked(value: object) -> object:
    """`value` (a class attribute) with each method computing `self`'s class checked."""
    if type(value) is types.FunctionType:
        code = value.__code__
        if code.co_argcount + code.co_posonlyargcount and _computes_a_class(code):
            return _on_instances_only(value)
    elif type(value) is property:
        parts = [_self_checked(f) for f in (value.fget, value.fset, value.fdel)]
        if parts != [value.fget, value.fset, value.fdel]:
            return property(*parts, value.__doc__)  # type: ignore[arg-type,call-arg]
    return value


_METHOD_SELF_GUARD_INSTALLED = False
_OWN_PACKAGE: Final = __name__.split(".")[0]


def install_method_self_guard() -> None:
    """Worker-only, before sealing: a trusted method that computes the class of `self` runs
    only on an instance of a class the guarded `type()` hands out.

    A class's own function is a plain function when fetched from the class
    (`collections.UserString.upper`, a property's `fget`), and Python never checks what it
    is called with, as C methods do. Trusted code written for its own instances made "another
    one like `self`" with `self.__class__(...)` or `type(self)(...)`; with a class as `self`
    that is its metaclass: `UserString.upper(C)` returned `type(C.data.upper())`, the
    unguarded `type()` of whatever the plugin's `upper` answered (`abc.ABCMeta`, whose
    three-argument call builds a class from any namespace), `ChainMap.new_child(C, name)`
    called the real `type(name, *C.maps)`, `enum.DynamicClassAttribute.getter(C, ...)` called
    `type(C)` with four values of the plugin's. Every public method (and property accessor)
    of the classes sealing covers whose code reads `__class__` or names `type` is guarded;
    the worker's own classes the guest reaches have none. Irreversible and process-wide."""
    global _METHOD_SELF_GUARD_INSTALLED  # noqa: PLW0603 - once per worker process
    if _METHOD_SELF_GUARD_INSTALLED:
        return
    for cls in shared_classes():
        module = cls.__dict__.get("__module__")
        if is_sealed(cls) or not isinstance(module, str) or module.split(".")[0] == _OWN_PACKAGE:
            continue
        for name, value in list(cls.__dict__.items()):
            if type(name) is str and not name.startswith("_"):
                checked = _self_checked(value)
                if checked is not value:
                    _b.type.__setattr__(cls, name, checked)
    _METHOD_SELF_GUARD_INSTALLED = True


def _direct_eval(*args: object, **kwargs: object) -> NoReturn:
    raise SuaveplanError("SAND_VM_EVAL_REJECTED", "eval/exec/compile are not available")


@dataclass(frozen=True, slots=True)
class CompiledModule:
    name: str
    filename: str
    is_package: bool
    code: types.CodeType


@dataclass(frozen=True, slots=True)
class CompiledBundle:
    name: str
    digest: str
    entry: str
    modules: Mapping[str, CompiledModule]
    interpreter_layer: bool = True

    @classmethod
    def of(cls, bundle: PluginBundle, modules: dict[str, CompiledModule]) -> CompiledBundle:
        """`bundle` compiled: its own name, digest, entry and layer, with `modules`."""
        return cls(
            bundle.name,
            bundle.digest,
            bundle.entry,
            types.MappingProxyType(modules),
            bundle.interpreter_layer,
        )


def _shared_builtins() -> dict[str, object]:
    """The builtins every guest gets, less the ones bound to its runtime (`print`,
    `__import__`, the `suaveplan` facade)."""
    b: dict[str, object] = {n: getattr(_b, n) for n in _SAFE_BUILTINS}
    for name in dir(_b):
        v = getattr(_b, name)
        if isinstance(v, type) and issubclass(v, BaseException) and not name.startswith("_"):
            b[name] = v
    b.update(
        {
            "getattr": _g_getattr,
            "hasattr": _g_hasattr,
            "setattr": _g_setattr,
            "delattr": _g_delattr,
            "type": GuardedType,
            "eval": _indirect,
            "exec": _indirect,
            "compile": _indirect,
            DIRECT_EVAL: _direct_eval,
            GUARD_FORMAT: _guarded_format,
            GUARD_PRIVATE: g_private,
            GUARD_PURE: g_pure,
            GUARD_CLASS_STAMP: g_class_stamp,
            GUARD_DUNDER_DEF: g_dunder_def,
            GUARD_ATTR_HOOK: g_attr_hook,
            "__build_class__": _build_class,
            "__name__": "builtins",
        }
    )
    return b


# At most one builtins dict made by `prepare_worker_interpreter` in the fork server, for the
# first runtime of the process to take as it is: a forked worker starts one runtime, and
# building (or copying) the dict there touches every builtin's refcount, a copy-on-write
# fault a page (~0.6 ms a worker). Taken, never shared: `list.pop` hands it to one runtime
# only, and any other runtime builds its own. The zygote never runs guest code, so every
# fork inherits it untouched.
_PREBUILT_BUILTINS: list[dict[str, object]] = []


def _take_shared_builtins() -> dict[str, object]:
    try:
        return _PREBUILT_BUILTINS.pop()
    except IndexError:
        return _shared_builtins()


def prepare_worker_interpreter() -> None:
    """Fork-server-only, once before any fork: preload every allowlisted module's facade (a
    worker under Landlock cannot open module files), guard Protocol checks, seal the shared
    classes and build the shared builtins, so that no fork pays for it. Irreversible and
    process-wide."""
    if is_prepared():
        return
    for name in sorted(ALLOWED_MODULES - {"suaveplan"}):
        module_facade(name)
    module_facade("urllib")
    preload_lazy_imports()
    install_protocol_guard()
    install_stdlib_guards()
    install_typing_type_guard()
    install_statistics_guard()
    install_method_self_guard()
    seal_shared_classes()
    _PREBUILT_BUILTINS[:] = [_shared_builtins()]


def compile_bundle(bundle: PluginBundle) -> CompiledBundle:
    """Check every module and compile it: in the fork server's limited compile child
    (`vm._compile_child`) only, never in a process that must outlive the plugin's source.

    A bundle loaded for the test-only process-layer-alone run is compiled unchecked.
    """
    known = {m.name for m in bundle.modules}
    top = bundle.entry.split(".")[0]
    out: dict[str, CompiledModule] = {}
    for m in bundle.modules:
        source: ast.Module | str = (
            check_plugin_module(m, known, top) if bundle.interpreter_layer else m.source
        )
        try:
            code = compile(source, m.filename, "exec", dont_inherit=True)
        except (RecursionError, MemoryError):
            raise too_complex(m.filename) from None
        out[m.name] = CompiledModule(m.name, m.filename, m.is_package, code)
    return CompiledBundle.of(bundle, out)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> object:
        return _json.loads(self.body)


# Codes the worker runtime's own guards raise (facades, guarded builtins, format checks,
# import gate, result encoding). A plugin may catch and re-raise one of those; any other
# SuaveplanError leaving plugin code is the plugin's own unless the host sent exactly it.
RUNTIME_ISSUED_CODES: Final = frozenset(
    {
        "SAND_VM_ATTRIBUTE_FORBIDDEN",
        "SAND_VM_EVAL_REJECTED",
        "SAND_VM_GLOBALS_FROZEN",
        "SAND_VM_INDIRECT_EVAL_REJECTED",
        "SAND_VM_MODULE_IMPORT_FORBIDDEN",
        "SAND_VM_NAME_UNAVAILABLE",
        "SAND_VM_RESULT_INVALID",
    }
)
_RUNTIME_FILES: Final = frozenset({__file__, _policy_file, _guards_file})


# The C accessors behind `exc.__dict__` and `NameError.name`: a plugin subclass's own
# property, `__getattribute__` or dict key `__eq__` never runs while the runtime reads them.
_EXC_DICT: Final = BaseException.__dict__["__dict__"]
_NAME_ERROR_NAME: Final = NameError.__dict__["name"]
_MAX_DETAIL_VALUES: Final = 256


def _exact_str(value: object, limit: int) -> str:
    """`value` as an exact `str` cut to `limit` ("" if it is not a str): a `str` subclass's
    `__getitem__`, `__eq__` or `__hash__` would run plugin code in the trusted path that
    reads it (error translation, `to_wire`, the protocol encoder)."""
    if type(value) is str:
        return value[:limit]
    if issubclass(type(value), str):  # not isinstance(): that reads `__class__`
        return str.__str__(value)[:limit]
    return ""


def _own_fields(exc: BaseException) -> dict[str, object]:
    """The exception's instance attributes with exact `str` keys, read without running a
    descriptor, `__getattribute__`, `__eq__` or `__hash__` the plugin defined."""
    fields = _EXC_DICT.__get__(exc, type(exc))
    return {k: v for k, v in fields.items() if type(k) is str}


def _plain_details(value: object) -> dict[str, object]:
    """A runtime error's `details` if they are still plain data (exact types, 64-bit ints, a
    few hundred values at most), else `{}`: the plugin may have replaced them with objects
    whose methods `to_wire` and the encoder would run."""
    left = [_MAX_DETAIL_VALUES]

    def copy(v: object, depth: int) -> object:
        left[0] -= 1
        if left[0] < 0 or depth > 8:
            raise ValueError
        if v is None or type(v) in (bool, float, str):
            return v
        if type(v) is int and -(2**63) <= v < 2**64:
            return v
        if type(v) is list or type(v) is tuple:
            return [copy(x, depth + 1) for x in v]
        if type(v) is dict and all(type(k) is str for k in v):
            return {k: copy(x, depth + 1) for k, x in v.items()}
        raise ValueError

    try:
        out = copy(value, 0)
    except ValueError:
        return {}
    return out if type(out) is dict else {}


def _plugin_text(exc: BaseException) -> str:
    """`str(exc)` of the plugin's exception: its own `__str__` may run, but only the text it
    returns is used; whatever it raises (a forged SuaveplanError too) is dropped."""
    try:
        return _exact_str(str(exc), 500)
    except BaseException:  # plugin code: nothing it raises leaves here
        return ""


def _raised_by_runtime(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename in _RUNTIME_FILES


def validate_result(value: object, _depth: int = 0) -> object:
    """Plain msgpack-able data, or SAND_VM_RESULT_INVALID."""
    if _depth > _MAX_DEPTH:
        raise SuaveplanError("SAND_VM_RESULT_INVALID", "result nested too deeply")
    if value is None or type(value) in (bool, int, float, str, bytes):
        if type(value) is int and not -(2**63) <= value < 2**64:
            raise SuaveplanError("SAND_VM_RESULT_INVALID", "integer out of range")
        return value
    if type(value) in (list, tuple):
        return [validate_result(v, _depth + 1) for v in value]  # type: ignore[attr-defined]
    if type(value) is dict:
        out: dict[str, object] = {}
        for k, v in value.items():
            if type(k) is not str:
                raise SuaveplanError("SAND_VM_RESULT_INVALID", "dict keys must be strings")
            out[k] = validate_result(v, _depth + 1)
        return out
    raise SuaveplanError(
        "SAND_VM_RESULT_INVALID", "result cannot be encoded", {"type": type(value).__name__}
    )


class GuestRuntime:
    """Runs one compiled plugin in this interpreter with curated builtins and facades."""

    def __init__(
        self,
        compiled: CompiledBundle,
        *,
        host_call: Callable[[str, str, dict[str, object]], object],
        log: Callable[[str, str], None],
    ) -> None:
        self._compiled = compiled
        self._host_call = host_call
        self._log = log
        self._modules: dict[str, types.ModuleType] = {}
        self._handlers: dict[str, list[Callable[[object], object]]] = {}
        self._builtins: dict[str, object] = {}
        self._host_errors: dict[int, tuple[SuaveplanError, dict[str, Any]]] = {}
        self._started = False

    # -- building -----------------------------------------------------------------------
    def _suaveplan(self) -> Facade:
        raw_call = self._host_call
        issued = self._host_errors

        def hc(cap: str, op: str, args: dict[str, object]) -> object:
            # Only plain data reaches the wire encoder: never a guest-defined object.
            plain = validate_result(args)
            assert isinstance(plain, dict)
            try:
                return raw_call(cap, op, plain)
            except SuaveplanError as exc:
                # The host's own answer: remembered by identity with its wire form as it
                # arrived, so what leaves the plugin later is the host's error, not a copy
                # the plugin edited or forged.
                issued[id(exc)] = (exc, exc.to_wire())
                raise

        def read_bytes(path: str) -> bytes:
            return hc("fs", "read_bytes", {"path": path})  # type: ignore[return-value]

        def read_text(path: str, encoding: str = "utf-8") -> str:
            return read_bytes(path).decode(encoding)

        def write_bytes(path: str, data: bytes) -> None:
            hc("fs", "write_bytes", {"path": path, "data": bytes(data)})

        def write_text(path: str, text: str, encoding: str = "utf-8") -> None:
            write_bytes(path, text.encode(encoding))

        def list_dir(path: str) -> list[str]:
            reply = hc("fs", "list_dir", {"path": path})
            return [str(x) for x in reply] if isinstance(reply, list) else []

        def exists(path: str) -> bool:
            return bool(hc("fs", "exists", {"path": path}))

        def fetch(
            url: str,
            method: str = "GET",
            headers: Mapping[str, str] | None = None,
            body: bytes | str | None = None,
        ) -> Response:
            data = body.encode() if isinstance(body, str) else bytes(body or b"")
            pairs = [[str(k), str(v)] for k, v in (headers or {}).items()]
            reply = hc(
                "fetch", "request", {"url": url, "method": method, "headers": pairs, "body": data}
            )
            if not isinstance(reply, dict):
                raise SuaveplanError("SAND_VM_RESULT_INVALID", "malformed fetch reply")
            raw = reply.get("headers") or []
            items = raw.items() if isinstance(raw, dict) else raw
            hdrs = {str(k).lower(): str(v) for k, v in items}
            return Response(
                int(reply.get("status", 0)),
                types.MappingProxyType(hdrs),
                bytes(reply.get("body") or b""),
            )

        def query(sql: str, params: object = ()) -> list[dict[str, object]]:
            reply = hc("db", "query", {"sql": sql, "params": list(params)})  # type: ignore[call-overload]
            if not isinstance(reply, dict):
                raise SuaveplanError("SAND_VM_RESULT_INVALID", "malformed db reply")
            cols = list(reply.get("columns") or [])
            return [dict(zip(cols, row, strict=False)) for row in reply.get("rows") or []]

        def get_secret(name: str) -> object:
            return hc("secrets", "get", {"name": name})

        def publish(topic: str, payload: object = None) -> None:
            hc("events", "publish", {"topic": topic, "payload": validate_result(payload)})

        handlers = self._handlers

        def subscribe(
            topic: str,
        ) -> Callable[[Callable[[object], object]], Callable[[object], object]]:
            if not issubclass(type(topic), str):
                raise TypeError("topic must be a string")
            # An exact str: the handler table is read outside `_guarded` (deliveries, the
            # sorted list sent at start), where a subclass's `__eq__`/`__lt__` would run.
            topic = str.__str__(topic)

            def register(fn: Callable[[object], object]) -> Callable[[object], object]:
                if topic not in handlers and len(handlers) >= MAX_SUBSCRIPTIONS:
                    raise ValueError(
                        f"a plugin may subscribe to at most {MAX_SUBSCRIPTIONS} topics"
                    )
                handlers.setdefault(topic, []).append(fn)
                return fn

            return register

        logf = self._log

        def level(name: str) -> Callable[..., None]:
            def emit(msg: object, *args: object) -> None:
                # Exact str before `%` and before the worker's log path slices and encodes it.
                text = str.__str__(str(msg))
                logf(name, str.__mod__(text, args) if args else text)

            return emit

        return Facade(
            "suaveplan",
            {
                "fs": Facade(
                    "suaveplan.fs",
                    {
                        "read_bytes": read_bytes,
                        "read_text": read_text,
                        "write_bytes": write_bytes,
                        "write_text": write_text,
                        "list_dir": list_dir,
                        "exists": exists,
                    },
                ),
                "fetch": fetch,
                "db": Facade("suaveplan.db", {"query": query}),
                "secrets": Facade("suaveplan.secrets", {"get": get_secret}),
                "events": Facade("suaveplan.events", {"publish": publish, "subscribe": subscribe}),
                "log": Facade(
                    "suaveplan.log", {n: level(n) for n in ("debug", "info", "warning", "error")}
                ),
                "SuaveplanError": SuaveplanError,
            },
        )

    def _make_builtins(self) -> dict[str, object]:
        b = _take_shared_builtins()
        b["print"] = self._make_print()
        b["__import__"] = self._import
        return b

    def _make_print(self) -> Callable[..., None]:
        logf = self._log

        def print_(
            *args: object,
            sep: str | None = " ",
            end: str | None = "\n",
            file: object = None,
            flush: bool = False,
        ) -> None:
            if file is not None:
                raise SuaveplanError("SAND_VM_NAME_UNAVAILABLE", "print(file=...) is not available")
            # `str.join` of an exact separator: a `str` subclass's own `join` (or `sep`'s) would
            # hand the worker's log path an object of the plugin's.
            glue = " " if sep is None else str.__str__(sep)
            logf("info", str.join(glue, [str(a) for a in args]))

        return print_

    def _make_unrestricted_builtins(self) -> dict[str, object]:
        """Test-only (process-layer-alone run): the real builtins, as an escaped guest has."""
        b = dict(vars(_b))
        b["print"] = self._make_print()
        real_import = _b.__import__

        def import_(
            name: str,
            globals: Mapping[str, object] | None = None,
            locals: object = None,
            fromlist: tuple[str, ...] | None = (),
            level: int = 0,
        ) -> object:
            if level == 0 and name == "suaveplan":
                return self._builtins["__sp_suaveplan__"]
            if level > 0:
                return self._import(name, globals, locals, fromlist, level)
            return real_import(name, globals, locals, fromlist or (), level)  # type: ignore[arg-type]

        b["__import__"] = import_
        return b

    def _import(
        self,
        name: str,
        globals: Mapping[str, object] | None = None,
        locals: object = None,
        fromlist: tuple[str, ...] | None = (),
        level: int = 0,
    ) -> object:
        forbidden = SuaveplanError(
            "SAND_VM_MODULE_IMPORT_FORBIDDEN", "import is not allowed", {"module": str(name)}
        )
        fromlist = tuple(fromlist or ())
        if level == 0:
            if name in C_IMPLICIT_IMPORTS and name in sys.modules:
                # C code importing for itself from a plugin frame (`datetime.strptime`): it
                # takes the module from sys.modules and ignores this answer. Plugin source
                # cannot name these (the import is refused at load), and gets nothing here.
                return None
            if name not in ALLOWED_MODULES:
                raise forbidden
            if name == "suaveplan":
                return self._builtins["__sp_suaveplan__"]
            if name == "urllib.parse" and not fromlist:
                return module_facade("urllib")
            return module_facade(name)
        pkg = str((globals or {}).get("__package__") or "")
        base = pkg.split(".")
        if level - 1 >= len(base):
            raise forbidden
        base = base[: len(base) - (level - 1)]
        target = ".".join([*base, *([name] if name else [])])
        if target not in self._compiled.modules:
            raise forbidden
        mod = self._load(target)
        for sub in fromlist:
            full = f"{target}.{sub}"
            if full in self._compiled.modules:
                setattr(mod, sub, self._load(full))
        return mod

    def _load(self, name: str) -> types.ModuleType:
        mod = self._modules.get(name)
        if mod is not None:
            return mod
        cm = self._compiled.modules[name]
        mod = types.ModuleType(name)
        g = mod.__dict__
        for k in ("__loader__", "__spec__", "__doc__"):
            g.pop(k, None)
        g["__builtins__"] = self._builtins
        g["__package__"] = name if cm.is_package else name.rpartition(".")[0]
        g["__file__"] = cm.filename
        self._modules[name] = mod
        _PLUGIN_MODULES[name] = mod
        try:
            exec(cm.code, g)  # noqa: S102 -- the plugin's own checked code, compiled in this worker
        except BaseException:
            del self._modules[name]
            raise
        return mod

    def start(self) -> None:
        if self._started:
            return
        if self._compiled.interpreter_layer:
            if hardening_was_applied() and not is_prepared():
                # A worker forked by something other than our fork server (which prepares
                # once, before forking): do it here. Irreversible and process-wide, so
                # never in the host or a test process.
                prepare_worker_interpreter()
            self._builtins = self._make_builtins()
        else:
            self._log("warning", "in-interpreter layer OFF: test-only process-layer run")
            self._builtins = self._make_unrestricted_builtins()
        self._builtins["__sp_suaveplan__"] = self._suaveplan()
        self._started = True
        arm_cpu_backstop()
        self._guarded(lambda: self._load(self._compiled.entry))

    # -- calling ------------------------------------------------------------------------
    def _guarded(self, fn: Callable[[], object]) -> object:
        """Run plugin code; what leaves is always an error this method built from exact
        plain data. Reading the plugin's exception must not run its code where that code
        could raise past this translation (`str(exc)[:500]` on a `__str__` raising a
        SuaveplanError sent any code but a host-only one) or hand `to_wire` and the encoder
        objects of its own (a re-raised guard error with edited `details`)."""
        try:
            return fn()
        except SuaveplanError as exc:
            host = self._host_errors.get(id(exc))
            if host is not None and host[0] is exc:
                raise SuaveplanError.from_wire(host[1]) from None
            fields = _own_fields(exc)
            code = fields.get("code")
            if (
                type(exc) is SuaveplanError
                and type(code) is str
                and code in RUNTIME_ISSUED_CODES
                and _raised_by_runtime(exc)
            ):
                raise SuaveplanError(
                    code,
                    _exact_str(fields.get("message"), 4096),
                    _plain_details(fields.get("details")),  # type: ignore[arg-type]
                ) from None
            raise SuaveplanError(
                "SAND_VM_PLUGIN_ERROR",
                "the plugin raised an error with a code only the sandbox issues",
                {"type": "SuaveplanError", "claimed_code": _exact_str(code, 128)},
            ) from None
        except NameError as exc:
            raise SuaveplanError(
                "SAND_VM_NAME_UNAVAILABLE",
                "name is not available",
                {"name": _exact_str(_NAME_ERROR_NAME.__get__(exc, NameError), 200)},
            ) from None
        except BaseException as exc:  # GeneratorExit, KeyboardInterrupt... end no worker
            raise SuaveplanError(
                "SAND_VM_PLUGIN_ERROR",
                "the plugin raised an exception",
                {"type": _exact_str(type(exc).__name__, 200), "message": _plugin_text(exc)},
            ) from None

    def call(self, name: str, args: list[object], kwargs: dict[str, object]) -> object:
        if not self._started:
            self.start()
        self._host_errors.clear()
        arm_cpu_backstop()
        entry = self._modules[self._compiled.entry]
        fn = entry.__dict__.get(name) if isinstance(name, str) else None
        if (
            fn is None
            or name.startswith("_")
            or not isinstance(fn, types.FunctionType)
            # Exact str: `functools.update_wrapper` copies any object's `__module__`, and a
            # str subclass's `__eq__` ran here, outside `_guarded`, with its errors sent as is.
            or type(fn.__module__) is not str
            or fn.__module__ not in self._compiled.modules
        ):
            raise SuaveplanError(
                "SAND_VM_NO_SUCH_FUNCTION", "no such public function", {"name": str(name)[:200]}
            )
        return validate_result(self._guarded(lambda: fn(*args, **kwargs)))

    def subscriptions(self) -> list[str]:
        return sorted(self._handlers)

    def deliver(self, topic: str, payload: object) -> None:
        self._host_errors.clear()
        arm_cpu_backstop()
        for handler in list(self._handlers.get(topic, ())):
            self._guarded(lambda h=handler: h(payload))  # type: ignore[misc]
