"""Ownership rules and the standard-library guards of the worker's guest layer.

What the plugin owns (its classes, their instances, its functions and modules) may expose
`_private` attributes to it; anything else may not. Plain `obj._x` syntax is rewritten by
`_policy` to `__sp_private__(obj, "_x", store)`, and the guarded `getattr` family uses the
same rule, so both refuse, for example, `ForwardRef._evaluate` (which `eval`s its string
with the real builtins) or `Enum._convert_` (which hands out a real module's contents and
writes into it), also when a plugin class inherits them.

The stdlib guards (`install_stdlib_guards`) close routes through which trusted standard-
library code would do for the guest what the guest may not do itself: copy's
`_reconstruct` (any `setattr`, dunders included), dataclasses' `Field.name` (pasted into
the source dataclasses `exec`s, and read back with `getattr`), the functional Enum API
(dunder class attributes such as `__match_args__`), `ABCMeta.register` on shared ABCs,
`UserString.format`/`format_map` (the real `str.format` of any template), UserDict's and
UserList's `__copy__` (keys of a `__dict__` the plugin answers, written into a real one),
`enum.property`'s member redirect (a `getattr` of its `name`, which the plugin can set),
`cached_property`'s cache store (a write of its `attrname`, likewise), dataclasses'
`_get_field` (a plugin `Field` subclass's `name` pasted into exec'd source), copy's
`deepcopy` (a plugin `__deepcopy__` was handed the memo, with the copied state of foreign
objects in it), dataclasses' `inspect.signature` (signature text `eval`ed by name) and
dataclasses' readers `fields`/`replace` (an instance `__dataclass_fields__` read natively).
`g_attr_hook` keeps a plugin class from answering `__class__`/`__dict__`. The guards patch
classes and modules, so they run in the fork server before sealing, like the Protocol guard.
"""

from __future__ import annotations

import abc
import builtins as _b
import collections
import contextlib
import copy
import copyreg
import ctypes
import dataclasses
import enum
import functools
import keyword
import sys
import types
import typing
import weakref
from collections.abc import Callable
from typing import Any, Final, NamedTuple, NoReturn

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._guest._policy import (
    CLASS_STAMP,
    FORMAT_ATTRS,
    METACLASS_HOOKS,
    SPOOFABLE_ATTRS,
    check_format_string,
    is_forbidden_attr,
    is_guarded_attr,
    is_owned_only_attr,
    norm,
)

# What the plugin itself created (classes through `__build_class__`, its modules).
PLUGIN_CLASSES: weakref.WeakSet[type] = weakref.WeakSet()
PLUGIN_MODULES: weakref.WeakValueDictionary[str, types.ModuleType] = weakref.WeakValueDictionary()

# Every plugin class carries a mark under this name holding the class's own `__mro__`
# tuple: the tuple itself for a pure class (plugin classes and `object` only, metaclass
# `type`: nothing but plugin code and data behind a `_private` name), else its `_TypeInfo`.
# A subclass that inherits the mark (one built by trusted code, e.g. the functional Enum
# API with a plugin mixin) or a class whose bases changed fails the identity check, and
# only trusted code can bind a dunder name.
_MARK: Final = "__sp_owned__"
# namedtuple's documented API is `_`-prefixed; these are its own functions (by code).
_NT = collections.namedtuple("_NT", "a")
_NT_CODES: Final = frozenset(
    {
        _NT._make.__func__.__code__,  # type: ignore[attr-defined]
        _NT._replace.__code__,
        _NT._asdict.__code__,
    }
)
_NT_DATA: Final = frozenset({"_fields", "_field_defaults"})
_TUPLEGETTER: Final = type(_NT.a)
_NIL: Final = object()


# Class statements being executed, innermost last, and their tokens (see `_policy`): a
# class whose own namespace holds a pending token was made from a plugin class body.
_BUILDING: list[object] = []
_PENDING: set[int] = set()


def g_class_stamp() -> object:
    """`__sp_class_stamp__`: the token of the class statement whose body is running."""
    return _BUILDING[-1]


def build_plugin_class(
    func: Callable[..., object], name: str, *bases: object, **kw: object
) -> object:
    """`__build_class__` with the class's token pending while it is made."""
    # A fresh function: unique, and callable, since typing 3.12 decides while the class is
    # made whether a Protocol's members are all callable (`__callable_proto_members_only__`).
    token: object = lambda: None  # noqa: E731
    _BUILDING.append(token)
    _PENDING.add(id(token))
    try:
        cls = _b.__build_class__(func, name, *bases, **kw)
    finally:
        _BUILDING.pop()
        _PENDING.discard(id(token))
    if isinstance(cls, _b.type) and cls.__dict__.get(CLASS_STAMP) is not token:
        # The "metaclass" is the type of the first base, which need not be a class: a base
        # that is an instance of a plugin class with its own `__new__` (made without calling
        # it, by namedtuple's `_make`) handed back any existing class, e.g. `ForwardRef`,
        # and the plugin would own it. A class statement yields a class made from its body.
        raise SuaveplanError(
            "SAND_VM_INDIRECT_EVAL_REJECTED", "a class statement must make its own class"
        )
    if isinstance(cls, _b.type):
        with contextlib.suppress(AttributeError, TypeError):
            _b.type.__delattr__(cls, CLASS_STAMP)
        # typing 3.12+ lists a Protocol's members when the class is made.
        members = cls.__dict__.get("__protocol_attrs__")
        if isinstance(members, set):
            members.discard(CLASS_STAMP)
    return cls


def _adopt(t: type) -> None:
    """A class still being built from a plugin class body is the plugin's already."""
    token = t.__dict__.get(CLASS_STAMP)
    if token is not None and id(token) in _PENDING and t not in PLUGIN_CLASSES:
        mark_plugin_class(t)


def forbidden(message: str) -> SuaveplanError:
    return SuaveplanError("SAND_VM_ATTRIBUTE_FORBIDDEN", message)


def _owner(mro: tuple[type, ...], name: str) -> type | None:
    for c in mro:
        if name in c.__dict__:
            return c
    return None


# A C type that sets `tp_getattro`/`tp_setattro` gets a `__getattribute__`/`__setattr__`
# entry in its dict even when the slot is the generic one (tuple, BaseException, dict...),
# while some C types' own slot forwards lookups elsewhere (types.GenericAlias hands
# `_evaluate` to its origin, a `ForwardRef`). The slot itself tells them apart: the same
# CPython 3.11-3.13 PyTypeObject layout `_seal` relies on (tp_getattro, tp_setattro follow
# 18 and 19 pointer-sized fields).
_PTR: Final = ctypes.sizeof(ctypes.c_void_p)
_SLOTS: Final = {"__getattribute__": 18, "__setattr__": 19, "__delattr__": 19}
_WRAPPER: Final = type(object.__dict__["__getattribute__"])


def _slot(cls: type, index: int) -> int | None:
    return ctypes.c_void_p.from_address(id(cls) + index * _PTR).value


def _hook_ok(mro: tuple[type, ...], hook: str, *base: type) -> bool:
    owner = _owner(mro, hook)
    if owner is None or owner in base or owner in PLUGIN_CLASSES:
        return True
    index = _SLOTS.get(hook)
    return (
        index is not None
        and type(owner.__dict__[hook]) is _WRAPPER
        and _slot(owner, index) == _slot(object, index)
    )


def _is_namedtuple_class(cls: type) -> bool:
    make = cls.__dict__.get("_make")
    return isinstance(make, classmethod) and getattr(make.__func__, "__code__", None) in _NT_CODES


def _namedtuple_api(owner: type, name: str) -> bool:
    """namedtuple's own `_make`/`_replace`/`_asdict`/`_fields`/`_field_defaults`."""
    if not issubclass(owner, tuple) or not _is_namedtuple_class(owner):
        return False
    if name in _NT_DATA:
        return True
    value = owner.__dict__[name]
    func = value.__func__ if isinstance(value, classmethod) else value
    return getattr(func, "__code__", None) in _NT_CODES


class _TypeInfo(NamedTuple):
    """What decides a `_private` lookup on a type, none of which can change afterwards:
    classes the plugin did not create are sealed or trusted, and no route lets the plugin
    write a dunder (so no hook and no `__bases__` changes)."""

    mro: tuple[type, ...]  # the type's own `__mro__` in a mark (see `_MARK`); () if cached
    pure: bool  # only plugin classes and `object`, metaclass `type`
    foreign: frozenset[str]  # guarded names (`_x`, `format`) a class of the MRO the plugin
    # did not create has
    plugin: bool  # a plugin class is in the MRO
    get_ok: bool  # `__getattribute__` is object's, type's or the plugin's
    set_ok: bool  # `__setattr__`/`__delattr__` likewise
    getattr_ok: bool  # no `__getattr__` fallback, or the plugin's


_HOOK_BASES: Final = (object, _b.type)
_TYPE: Final = _b.type
_FUNCTION: Final = types.FunctionType
_MODULE: Final = types.ModuleType


def _compute_info(t: type, mark: bool) -> _TypeInfo:
    mro = t.__mro__
    return _TypeInfo(
        mro if mark else (),
        type(t) is _b.type and all(c is object or c in PLUGIN_CLASSES for c in mro),
        frozenset(
            k
            for c in mro
            if c not in PLUGIN_CLASSES
            for k in c.__dict__
            if isinstance(k, str) and (is_owned_only_attr(k) or k in FORMAT_ATTRS)
        ),
        any(c in PLUGIN_CLASSES for c in mro),
        _hook_ok(mro, "__getattribute__", *_HOOK_BASES),
        all(_hook_ok(mro, h, *_HOOK_BASES) for h in ("__setattr__", "__delattr__")),
        _hook_ok(mro, "__getattr__"),
    )


# Types the plugin did not create (or not yet: one being built), by id, validated by a weak
# reference that also drops the entry with the type.
_INFO: dict[int, tuple[weakref.ref[type], _TypeInfo]] = {}


def _type_info(t: type) -> _TypeInfo:
    mark = t.__dict__.get(_MARK)
    if type(mark) is _TypeInfo and mark.mro is t.__mro__:
        return mark
    entry = _INFO.get(id(t))
    if entry is not None and entry[0]() is t:
        return entry[1]
    key = id(t)
    info = _compute_info(t, mark=False)
    _INFO[key] = (weakref.ref(t, lambda _ref: _INFO.pop(key, None)), info)
    return info


def _resolves_to_plugin(mro: tuple[type, ...], name: str, store: bool) -> bool:
    owner = _owner(mro, name)
    if owner is None:
        return False
    return owner in PLUGIN_CLASSES or (not store and _namedtuple_api(owner, name))


def _instance_ok(info: _TypeInfo, t: type, name: str, store: bool) -> bool:
    if not info.get_ok or (store and not info.set_ok):
        return False
    if name in info.foreign:
        return _resolves_to_plugin(t.__mro__, name, store)
    if not info.plugin:
        return False
    return info.getattr_ok or _owner(t.__mro__, name) is not None


def instance_attr_ok(t: type, name: str, store: bool = False) -> bool:
    """Whether `name` on an instance of `t` is the plugin's own (a plugin class defines it,
    or it lives in the instance's own dict with no foreign hook in between)."""
    return _instance_ok(_type_info(t), t, name, store)


def _class_attr_ok(cls: type, name: str, store: bool) -> bool:
    meta = _type_info(type(cls))
    if name in meta.foreign or not meta.get_ok:
        return False  # a metaclass's own attribute (plugins cannot define metaclasses)
    info = _type_info(cls)
    if name in info.foreign:
        return _resolves_to_plugin(cls.__mro__, name, store)
    if not info.plugin:
        return False
    return store or meta.getattr_ok or _owner(cls.__mro__, name) is not None


def _super_attr_ok(obj: Any, name: str) -> bool:
    start, self_class = obj.__thisclass__, obj.__self_class__
    if self_class is None:
        return False
    mro = self_class.__mro__
    if start not in mro:
        return False
    owner = _owner(mro[mro.index(start) + 1 :], name)
    return owner is not None and owner in PLUGIN_CLASSES


def is_plugin_module(obj: types.ModuleType) -> bool:
    name = obj.__dict__.get("__name__")
    return isinstance(name, str) and PLUGIN_MODULES.get(name) is obj


def private_ok(obj: object, name: str, store: bool = False) -> bool:
    """Whether the guest may read (or, with `store`, write or delete) `obj.<name>`."""
    t = type(obj)
    if t is _FUNCTION:
        glb = obj.__globals__  # type: ignore[attr-defined]
        mod = PLUGIN_MODULES.get(glb.get("__name__"))
        return mod is not None and mod.__dict__ is glb
    if t is _MODULE:
        return is_plugin_module(obj)  # type: ignore[arg-type]
    if t is super:
        return not store and _super_attr_ok(obj, name)
    if t is _b.type or isinstance(obj, _b.type):
        if _PENDING:
            _adopt(obj)  # type: ignore[arg-type]
        return _class_attr_ok(obj, name, store)  # type: ignore[arg-type]
    if isinstance(obj, types.ModuleType):
        return False
    if _PENDING:
        _adopt(t)
    return instance_attr_ok(t, name, store)


def g_private(obj: object, name: str, store: bool = False) -> object:
    """`__sp_private__`: `obj` back if `obj.<name>` is the plugin's own, else refuse."""
    t = type(obj)
    if t is _TYPE:
        if getattr(obj, _MARK, None) is obj.__mro__:  # type: ignore[attr-defined]
            return obj
    elif t is not _FUNCTION and t is not _MODULE:
        mark = getattr(t, _MARK, None)
        if mark is t.__mro__:
            return obj
        if type(mark) is _TypeInfo and mark.mro is t.__mro__ and _instance_ok(mark, t, name, store):
            return obj
    if private_ok(obj, name, store):
        return obj
    raise forbidden(
        "private attributes (and `obj`) of objects the plugin did not create are not available"
    )


def g_pure(obj: object) -> bool:
    """`__sp_pure_self__`: whether every `_private` name of `obj` is the plugin's own."""
    t = type(obj)
    if t is _TYPE:
        return getattr(obj, _MARK, None) is obj.__mro__  # type: ignore[attr-defined]
    return getattr(t, _MARK, None) is t.__mro__


def mark_plugin_class(cls: type) -> None:
    PLUGIN_CLASSES.add(cls)
    # Looked up while it was being built (`__init_subclass__`, `__set_name__`), its own
    # names counted as foreign: decide afresh now that it is the plugin's.
    _INFO.pop(id(cls), None)
    if cls.__dict__.get("_is_protocol"):
        return  # typing counts every name in a Protocol's namespace as a member
    info = _compute_info(cls, mark=True)
    with contextlib.suppress(TypeError, AttributeError):  # a metaclass refusing it
        _b.type.__setattr__(cls, _MARK, info.mro if info.pure else info)


def _is_metaclass(cls: type, guarded: tuple[type, ...]) -> bool:
    # By identity: `in` would ask each class's metaclass for `__eq__`.
    return any(c is _b.type or any(c is g for g in guarded) for c in cls.__mro__)


def _no_metaclass() -> SuaveplanError:
    return SuaveplanError(
        "SAND_VM_INDIRECT_EVAL_REJECTED", "a class deriving from type is not available"
    )


def refuse_metaclass(cls: type, *guarded: type) -> None:
    """A class deriving from the real `type` (e.g. `class M(typing.Type)`) is a metaclass:
    calling it with three arguments builds a class from any namespace (dunders included).
    `guarded`: what the guest has for `type` (its subclasses are refused alike)."""
    if _is_metaclass(cls, guarded):
        raise _no_metaclass()


def refuse_metaclass_bases(bases: tuple[object, ...], *guarded: type) -> None:
    """`refuse_metaclass` before the class exists. While `type.__new__` makes a class it runs
    the plugin's hooks with it (`__set_name__` of its namespace, a base's `__init_subclass__`,
    a descriptor's `__get__` that `abc` reads), so a metaclass refused only once it was made
    had already been handed out. The bases are resolved as `__build_class__` resolves them
    (CPython's `update_bases`: a base that is not a class is replaced by what its
    `__mro_entries__` returns; `typing.Type[int]` gives its origin), so `__mro_entries__`
    runs twice, here and in `__build_class__`: the plugin's own can answer differently the
    second time only with classes it holds, and it holds no metaclass."""
    for base in bases:
        if issubclass(_b.type(base), _b.type):
            resolved: tuple[object, ...] = (base,)
        else:
            entries = getattr(base, "__mro_entries__", None)
            if entries is None:
                continue
            resolved = entries(bases)
            if not issubclass(_b.type(resolved), tuple):
                raise TypeError("__mro_entries__ must return a tuple")
        for cls in resolved:
            if issubclass(_b.type(cls), _b.type) and _is_metaclass(cls, guarded):  # type: ignore[arg-type]
                raise _no_metaclass()


def refuse_metaclass_hooks(cls: type) -> None:
    """A plugin class whose MRO finds a `METACLASS_HOOKS` name in the plugin's own classes:
    `abc` would call it with the classes it checks. The policy refuses a class body that
    defines one; this holds whatever else put one into a plugin class's namespace. (A
    foreign class's own, e.g. `types.GenericAlias.__instancecheck__`, is trusted code.)"""
    for name in METACLASS_HOOKS:
        owner = _owner(cls.__mro__, name)
        if owner is not None and (owner is cls or owner in PLUGIN_CLASSES):
            raise forbidden(f"a class may not have {name} (a metaclass hook)")


def check_match_args(cls: type) -> None:
    """A class pattern reads each `__match_args__` name natively from any subject the class
    admits; an ABC admits whatever its `__subclasshook__`/`register` says. Private and
    formatting names are allowed only where they resolve to the plugin's own attribute (or
    a namedtuple field) on an honest class."""
    names = getattr(cls, "__match_args__", ())
    if not isinstance(names, tuple):
        return
    for name in names:
        if not isinstance(name, str) or not is_guarded_attr(name):
            continue
        owner = _owner(cls.__mro__, name)
        field = owner is not None and isinstance(owner.__dict__[name], _TUPLEGETTER)
        if isinstance(cls, abc.ABCMeta) or not (field or instance_attr_ok(cls, name)):
            raise forbidden("a match pattern may not read that attribute")


def _field_name_ok(name: object) -> bool:
    return (
        type(name) is str
        and name.isidentifier()
        and not keyword.iskeyword(name)
        and not is_forbidden_attr(name)
    )


def check_dataclass_fields(cls: type, extra: tuple[object, ...] = ()) -> None:
    """Field names dataclasses will paste into its generated source and read with `getattr`
    (asdict, astuple, replace, the generated methods): plain identifiers, and a private or
    formatting name only where it resolves to the plugin's own attribute."""
    names: list[object] = list(extra)
    for c in cls.__mro__:
        fields = c.__dict__.get("__dataclass_fields__")
        if fields is None:
            continue
        if not isinstance(fields, dict):
            raise forbidden("malformed dataclass fields")
        for key, f in fields.items():
            if type(f) is not dataclasses.Field or f.name != key:
                raise forbidden("malformed dataclass fields")
            names.append(key)
    for name in names:
        if not _field_name_ok(name):
            raise forbidden("a dataclass field name must be a plain identifier")
        assert isinstance(name, str)
        if is_guarded_attr(name) and not instance_attr_ok(cls, name):
            raise forbidden("a dataclass field may not name an attribute the plugin does not own")


_OBJECT_GETATTRIBUTE: Final = object.__getattribute__


class _RefusedAttr:
    """What a plugin class's own `__class__` or `__dict__` becomes: a data descriptor (so no
    instance dict entry shadows it) whose every use raises. Not AttributeError: that would
    hand the name on to the class's `__getattr__`."""

    __slots__ = ()

    def __get__(self, instance: object, owner: object = None) -> NoReturn:
        raise forbidden("a class may not define __class__ or __dict__")

    def __set__(self, instance: object, value: object) -> NoReturn:
        raise forbidden("a class may not define __class__ or __dict__")

    def __delete__(self, instance: object) -> NoReturn:
        raise forbidden("a class may not define __class__ or __dict__")


_REFUSED_ATTR: Final = _RefusedAttr()


def _bound(hook: object, instance: object) -> Any:
    # How CPython calls a `__getattribute__`/`__getattr__` found on the type: through the
    # descriptor protocol (a function, a static or class method, a property's value).
    get = getattr(type(hook), "__get__", None)
    return get(hook, instance, type(instance)) if get is not None else hook


def _exact_name(name: object) -> object:
    # Not isinstance(): that would read `name.__class__`.
    return str.__str__(name) if type(name) is not str and issubclass(type(name), str) else name


def g_attr_hook(name: str) -> Callable[[object], object]:
    """`__sp_attr_hook__(name)`: the outermost decorator of a class body's `__class__`,
    `__dict__`, `__getattribute__` and `__getattr__`. Standard-library code takes
    `obj.__class__` and `obj.__dict__` for the real class and instance dict: dataclasses'
    generated `__eq__` and ordering compare `other.__class__ is self.__class__` and then read
    every field, private ones too, from the other object, so a plugin answering a foreign
    class there read `ForwardRef._evaluate` (an `eval` with the real builtins) off a
    `ForwardRef`; UserDict's `__copy__` wrote the keys of an answered `__dict__` into a real
    one. A class's own `__class__`/`__dict__` raise when used; its `__getattribute__` never
    sees those two names (they come from object's lookup) and its `__getattr__` is never
    asked for them."""
    if name in SPOOFABLE_ATTRS:
        return lambda value: _REFUSED_ATTR
    if name == "__getattribute__":

        def wrap_getattribute(hook: object) -> object:
            def __getattribute__(self: object, attr: str) -> object:
                attr = _exact_name(attr)  # type: ignore[assignment]
                if attr in SPOOFABLE_ATTRS:
                    return _OBJECT_GETATTRIBUTE(self, attr)
                return _bound(hook, self)(attr)

            return __getattribute__

        return wrap_getattribute
    if name == "__getattr__":

        def wrap_getattr(hook: object) -> object:
            def __getattr__(self: object, attr: str) -> object:
                attr = _exact_name(attr)  # type: ignore[assignment]
                if attr in SPOOFABLE_ATTRS:
                    raise AttributeError(attr)
                return _bound(hook, self)(attr)

            return __getattr__

        return wrap_getattr
    raise forbidden("no attribute hook of that name")


_DC_FIELDS: Final = "__dataclass_fields__"
_TYPE_LOOKUP: Final = _b.type.__dict__["__getattribute__"]
# Classes whose fields passed the check, by id, with the dict that passed (see `_class_fields`).
_DC_CHECKED: dict[int, tuple[weakref.ref[type], dict[str, Any], int]] = {}


def _class_fields(class_or_instance: object) -> dict[str, Any]:
    """The fields dataclasses may trust for `class_or_instance`: the class's own (or a base's)
    `__dataclass_fields__`, found by the type's own lookup, never an instance attribute or
    what a plugin `__getattribute__` answers. dataclasses' `fields()`, `replace()` and what
    builds on them (`asdict`, `astuple`, a frozen slotted class's pickling) read each field
    with a native `getattr(obj, field.name)`: an instance `__dataclass_fields__` (planted
    through copy's state, e.g. the real instance dict a shallow `copy.copy` hands a plugin's
    `__setstate__`) naming `format` read the unguarded `str.format` of a `str` subclass. So
    every name must also be one the plugin may read on an instance of the class."""
    t = type(class_or_instance)
    cls: Any = class_or_instance if issubclass(t, _b.type) else t
    try:
        fields = _TYPE_LOOKUP(cls, _DC_FIELDS)
    except AttributeError:
        raise TypeError("must be called with a dataclass type or instance") from None
    if type(fields) is not dict:
        raise forbidden("malformed dataclass fields")
    done = _DC_CHECKED.get(id(cls))
    if done is not None and done[0]() is cls and done[1] is fields and done[2] == len(fields):
        return fields
    for key, f in fields.items():
        if type(f) is not dataclasses.Field or type(key) is not str or f.name != key:
            raise forbidden("malformed dataclass fields")
        if not _field_name_ok(key) or (is_guarded_attr(key) and not instance_attr_ok(cls, key)):
            raise forbidden("a dataclass field may not name an attribute the plugin cannot read")
    # Field names are set once (`_write_once_field_name`) and only trusted code holds the
    # dict, so a class checked with this very dict, as long, needs no second look.
    key_id = id(cls)
    _DC_CHECKED[key_id] = (
        weakref.ref(cls, lambda _ref: _DC_CHECKED.pop(key_id, None)),
        fields,
        len(fields),
    )
    return fields


def guarded_fields(class_or_instance: object) -> tuple[Any, ...]:
    """dataclasses.fields over the class's own checked fields (see `_class_fields`)."""
    regular = dataclasses._FIELD  # type: ignore[attr-defined]
    return tuple(f for f in _class_fields(class_or_instance).values() if f._field_type is regular)


# replace()'s own complaints: ValueError through 3.12, TypeError from 3.13.
_REPLACE_ERROR: Final = TypeError if sys.version_info >= (3, 13) else ValueError


def _replace_checked(obj: Any, changes: dict[str, Any]) -> object:
    classvar = dataclasses._FIELD_CLASSVAR  # type: ignore[attr-defined]
    initvar = dataclasses._FIELD_INITVAR  # type: ignore[attr-defined]
    for f in _class_fields(obj).values():
        if f._field_type is classvar:
            continue
        if not f.init:
            if f.name in changes:
                raise _REPLACE_ERROR(
                    f"field {f.name} is declared with init=False, it cannot be specified "
                    "with replace()"
                )
            continue
        if f.name not in changes:
            if f._field_type is initvar and f.default is dataclasses.MISSING:
                raise _REPLACE_ERROR(f"InitVar {f.name!r} must be specified with replace()")
            changes[f.name] = getattr(obj, f.name)
    return obj.__class__(**changes)


def guarded_replace(obj: Any, /, **changes: Any) -> object:
    """dataclasses.replace (3.11-3.13) over the class's own checked fields."""
    if not hasattr(type(obj), _DC_FIELDS):
        raise TypeError("replace() should be called on dataclass instances")
    return _replace_checked(obj, changes)


def guarded_replace_method(self: Any, /, **changes: Any) -> object:
    """3.13's `_replace`, which dataclasses installs as each class's `__replace__`."""
    return _replace_checked(self, changes)


def _own_function(value: object) -> bool:
    """A function of the plugin's own code (its globals are one of the plugin's modules)."""
    if type(value) is not types.FunctionType:
        return False
    glb = value.__globals__
    name = glb.get("__name__")
    mod = PLUGIN_MODULES.get(name) if type(name) is str else None
    return mod is not None and mod.__dict__ is glb


# What `typing.overload` returns for every overload stub (3.11-3.13): a function that raises.
_OVERLOAD_STUB: Final = getattr(typing, "_overload_dummy", None)


def g_dunder_def(value: object) -> object:
    """`__sp_dunder_def__`: a decorated dunder method must still be a method, and the
    plugin's own: trusted code calls these hooks with what it holds (`__exit__` gets a
    traceback, `__eq__` whatever trusted code compares), so a decorator returning someone
    else's function (`staticmethod(collections.UserList.append)`) put code the plugin did not
    write, which might treat those arguments differently from a plugin function, in the
    hook's place."""
    if type(value) is types.FunctionType:
        if _own_function(value) or value is _OVERLOAD_STUB:
            return value
    elif type(value) is property:
        if all(f is None or _own_function(f) for f in (value.fget, value.fset, value.fdel)):
            return value
    elif type(value) in (classmethod, staticmethod) and _own_function(
        value.__func__  # type: ignore[attr-defined]
    ):
        return value
    raise forbidden(
        "a dunder method must stay the plugin's own function (or its class/static method, property)"
    )


# -- stdlib guards (fork server, before sealing) ---------------------------------------------


def _state_ok(y: object, state: object, strict: bool) -> dict[str, object]:
    items: dict[object, object] = dict(state)  # type: ignore[call-overload]
    out: dict[str, object] = {}
    for key, value in items.items():
        if not isinstance(key, str):
            raise forbidden("copy may not set that attribute")
        name = norm(key)  # an exact str: what is checked is what is set
        if is_forbidden_attr(name) or (
            strict and is_owned_only_attr(name) and not private_ok(y, name, store=True)
        ):
            raise forbidden("copy may not set that attribute")
        out[name] = value
    return out


def _setstate_state(y: object, state: object) -> object:
    """The state a copy of the plugin's object hands `y.__setstate__`, its dicts never the
    ones it was given. A shallow `copy.copy` of a plugin object that keeps object's own
    `__reduce_ex__` passes the original's real instance `__dict__` (object's `__getstate__`
    returns it, not a copy): the plugin's own `__setstate__` wrote a dunder key into it, an
    instance `__dataclass_fields__` naming `format`. So the plugin's own `__setstate__` gets
    copies; one it did not write (some set every key of a dict as an attribute or put it in
    the instance's `__dict__`: `BaseException`'s, the dict ending `io.StringIO`/`BytesIO`'s
    and `functools.partial`'s state) gets them checked like the state copy sets itself,
    dict subclasses included (`BaseException.__setstate__` takes any dict)."""
    owner = _owner(type(y).__mro__, "__setstate__")
    own = owner is not None and owner in PLUGIN_CLASSES

    def fix(d: object) -> object:
        # Not isinstance(): that would read the plugin's `__class__`.
        if not issubclass(type(d), dict):
            return d
        return dict(d) if own else _state_ok(y, d, strict=True)  # type: ignore[call-overload]

    if issubclass(type(state), tuple):
        return tuple(fix(item) for item in state)  # type: ignore[attr-defined]
    return fix(state)


_PARTIAL_SETSTATE: Final = vars(functools.partial)["__setstate__"]


def _refuse_partial_namespace(y: object, state: object) -> None:
    """`functools.partial.__setstate__((func, args, keywords, namespace))` makes `namespace`
    the instance `__dict__` without checking that it is a dict: copy handed a partial the
    list (or plugin object) a plugin's `__reduce__` chose, and attribute access then read it
    as a dict (a `SystemError` on 3.11-3.12; on 3.13 a store took a bytearray's bytes for the
    dict's keys pointer: memory corruption). Only a dict (or None) reaches a partial; copy's
    check of a plugin object's state has already made a `dict` subclass a plain dict."""
    if getattr(type(y), "__setstate__", None) is not _PARTIAL_SETSTATE:
        return
    # An exact tuple: C reads a subclass's items past its own `__getitem__`.
    if type(state) is not tuple or (
        len(state) == 4 and state[3] is not None and type(state[3]) is not dict
    ):
        raise forbidden("a copied functools.partial's namespace must be a dict")


def _trusted_deepcopy_hook(cls: type) -> bool:
    """Whether `x.__deepcopy__` for an instance of `cls` is a method of a class the plugin
    did not create, found by the ordinary lookup (no plugin `__getattribute__`/`__getattr__`
    could have answered it instead)."""
    mro = cls.__mro__
    owner = _owner(mro, "__deepcopy__")
    return (
        owner is not None
        and owner not in PLUGIN_CLASSES
        and _owner(mro, "__getattribute__") not in PLUGIN_CLASSES
        and _owner(mro, "__getattr__") not in PLUGIN_CLASSES
    )


def guarded_deepcopy(x: object, memo: dict[int, Any] | None = None, _nil: Any = _NIL) -> Any:
    """copy.deepcopy (CPython 3.11-3.13), except that a `__deepcopy__` hook the plugin wrote
    gets an empty memo of its own. The copy's memo holds the copies (and, to keep them
    alive, the originals) of the state of everything copied so far, foreign objects' private
    and dunder slots included: a plugin hook read a `typing.ForwardRef`'s
    `__forward_code__` from it, a code object compiled from the plugin's own text. Only
    `dataclasses.asdict`/`astuple` copy for the plugin, so its hooks never need the memo."""
    d = id(x)
    if memo is None:
        memo = {}
    else:
        y = memo.get(d, _nil)
        if y is not _nil:
            return y
    cls = type(x)
    copier: Any = copy._deepcopy_dispatch.get(cls)  # type: ignore[attr-defined]
    if copier is not None:
        y = copier(x, memo)
    elif issubclass(cls, _b.type):
        y = x
    else:
        copier = getattr(x, "__deepcopy__", None)
        if copier is not None:
            y = copier(memo if _trusted_deepcopy_hook(cls) else {})
        else:
            reductor: Any = copyreg.dispatch_table.get(cls)
            if reductor:
                rv = reductor(x)
            else:
                reductor = getattr(x, "__reduce_ex__", None)
                if reductor is not None:
                    rv = reductor(4)
                else:
                    reductor = getattr(x, "__reduce__", None)
                    if not reductor:
                        raise copy.Error(f"un(deep)copyable object of type {cls}")
                    rv = reductor()
            y = x if isinstance(rv, str) else copy._reconstruct(x, memo, *rv)  # type: ignore[attr-defined]
    if y is not x:
        memo[d] = y
        copy._keep_alive(x, memo)  # type: ignore[attr-defined]
    return y


def guarded_reconstruct(  # noqa: PLR0917 - copy._reconstruct's own signature
    x: object,
    memo: dict[int, object] | None,
    func: Callable[..., object],
    args: Any,
    state: object = None,
    listiter: Any = None,
    dictiter: Any = None,
    *,
    deepcopy: Callable[..., Any] = guarded_deepcopy,
) -> object:
    """copy._reconstruct (CPython 3.11-3.13) with the state checked before it is applied:
    the state a `__reduce_ex__` returns is set on whatever its callable returned (a class,
    a function), so unchecked it is a `setattr` of any name, `__match_args__` included."""
    # The object's own class chose (callable, args, state): a foreign class restores its own
    # private state on its own copy; a plugin object's choice gets every key checked.
    strict = _type_info(type(x)).plugin
    deep = memo is not None
    if deep and args:
        args = (deepcopy(arg, memo) for arg in args)
    y: Any = func(*args)
    if deep:
        memo[id(x)] = y  # type: ignore[index]
    if state is not None:
        if deep:
            state = deepcopy(state, memo)
        if hasattr(y, "__setstate__"):
            if strict:
                state = _setstate_state(y, state)
            _refuse_partial_namespace(y, state)
            y.__setstate__(state)
        else:
            if isinstance(state, tuple) and len(state) == 2:
                state, slotstate = state
            else:
                slotstate = None
            if state is not None:
                y.__dict__.update(_state_ok(y, state, strict))
            if slotstate is not None:
                for key, value in _state_ok(y, slotstate, strict).items():
                    setattr(y, key, value)
    if listiter is not None:
        for item in listiter:
            y.append(deepcopy(item, memo) if deep else item)
    if dictiter is not None:
        for k, v in dictiter:
            if deep:
                y[deepcopy(k, memo)] = deepcopy(v, memo)
            else:
                y[k] = v
    return y


def _checked_enum_names(names: object) -> object:
    """The functional Enum API sets each name in the new class's namespace: a dunder
    (`__match_args__`, `__dataclass_fields__`) would be a plain class attribute."""
    if names is None:
        return names
    # What is checked is what enum gets: plain str and list, never the guest's subclass
    # (its own `split` or `__iter__` could answer differently the second time).
    if isinstance(names, str):
        text = str.__str__(names)
        listed: list[object] = list(text.replace(",", " ").split())
        out: object = text
    elif isinstance(names, (tuple, list)) and names and isinstance(names[0], str):
        listed = list(names)
        out = listed
    else:
        pairs = []
        for item in names:  # type: ignore[attr-defined]
            if isinstance(item, str):
                pairs.append((item, names[item]))  # type: ignore[index]
            else:
                k, v = item
                pairs.append((k, v))
        listed, out = [k for k, _ in pairs], pairs
    for name in listed:
        if type(name) is not str or is_forbidden_attr(name):
            # Exact str only: a subclass's own `__eq__`/`__hash__` would decide the key.
            raise forbidden("an Enum member name must be a plain str and not a dunder name")
    return out


def _checked_user_string(method: str) -> Callable[..., object]:
    """UserString.format/format_map call the real `str.format` on `self.data`: the runtime's
    guarded `.format` sees a Python method there, so the template is checked here."""

    def checked(self: Any, /, *args: object, **kwargs: object) -> object:
        data = self.data  # once: a plugin subclass's property could answer differently
        if isinstance(data, str):
            check_format_string(data)
        return getattr(data, method)(*args, **kwargs)

    return checked


def _checked_user_copy(copy_data: Callable[[Any], object]) -> Callable[[Any], object]:
    """UserDict/UserList `__copy__` (what `.copy()` and `copy.copy` run): `inst =
    self.__class__.__new__(self.__class__)` then `inst.__dict__.update(self.__dict__)`.
    A plugin class answers `__class__` and `__dict__` itself (properties), so that was a
    write of any keys into the real dict of any object its `__new__` returned: an instance
    `__dataclass_fields__` that `dataclasses.replace()` trusted, reading a forged field
    `format` natively (the unguarded `str.format`). The keys are checked like the state
    copy sets itself; the state is read once."""

    def __copy__(self: Any) -> object:
        cls = self.__class__
        inst = cls.__new__(cls)
        state = dict(self.__dict__)
        target = inst.__dict__
        target.update(_state_ok(inst, state, strict=True))
        target["data"] = copy_data(state["data"])
        return inst

    return __copy__


def _write_once_field_name(self: object, name: str, value: object) -> None:
    # dataclasses sets `name` once, before the field joins a class; after that it is what
    # dataclasses pastes into generated source and reads back with getattr().
    if name == "name" and getattr(self, "name", None) is not None:
        raise forbidden("a dataclass field's name cannot be changed")
    object.__setattr__(self, name, value)


def _no_field_name_delete(self: object, name: str) -> None:
    if name == "name":
        raise forbidden("a dataclass field's name cannot be changed")
    object.__delattr__(self, name)


def _exact_field(get_field: Callable[..., Any]) -> Callable[..., Any]:
    """dataclasses' `_get_field` takes a class attribute that is a `Field` as the field
    itself, a plugin's subclass too. Such a subclass can override the `name` slot with a
    property: its setter accepts the name dataclasses sets once, its getter answers
    otherwise later, and dataclasses reads `f.name` again for each line of the source it
    `exec`s (and for `setattr(cls, f.name, ...)`), so the guest's text became code no AST
    check saw. Only an exact `Field` is used; its `name` is a slot set once (see
    `_write_once_field_name`) to the annotation's name."""

    def _get_field(cls: type, a_name: str, *args: object, **kwargs: object) -> Any:
        f = get_field(cls, a_name, *args, **kwargs)
        if type(f) is not dataclasses.Field:
            raise forbidden("a dataclass field must be a dataclasses.Field, not a subclass")
        return f

    return _get_field


_NOT_CACHED: Final = object()


def _checked_cached_property(get: Callable[..., object]) -> Callable[..., object]:
    """functools.cached_property stores its value with `instance.__dict__[self.attrname] =`,
    and `attrname` is a public attribute the plugin may set (or a subclass's property): on
    the plugin's own instances that was a write of any name, dunders included, e.g. an
    instance `__dataclass_fields__` that `dataclasses.fields()`/`asdict()` then trusted as
    the class's checked fields (and read `getattr(obj, "format")` from a `str` subclass:
    the unguarded `str.format`). On an instance of a plugin class the name is read once
    and checked as the guarded `setattr` checks it; other instances keep the original."""

    def __get__(self: Any, instance: object, owner: object = None) -> object:
        if instance is None or not _type_info(type(instance)).plugin:
            return get(self, instance, owner)
        name = self.attrname
        if name is None:
            raise TypeError(
                "Cannot use cached_property instance without calling __set_name__ on it."
            )
        if not isinstance(name, str):
            raise TypeError("a cached_property's attrname must be a string")
        n = norm(name)
        if is_forbidden_attr(n) or (
            is_owned_only_attr(n) and not private_ok(instance, n, store=True)
        ):
            raise forbidden("a cached_property may not store under that name")
        try:
            cache = instance.__dict__
        except AttributeError:
            raise TypeError("no '__dict__' on the instance to cache the property in") from None
        val = cache.get(n, _NOT_CACHED)
        if val is _NOT_CACHED:
            val = self.func(instance)
            cache[n] = val
        return val

    return __get__


def _checked_enum_property(get: Callable[..., object]) -> Callable[..., object]:
    """enum.property.__get__ (3.12+) reads `getattr(self._cls_type, self.name)` or
    `getattr(instance._value_, self.name)` for a member redirect. A plugin subclass owns
    `_attr_type`/`_cls_type` (its own class attributes) and `name` is a public attribute, so
    that was a `getattr` of any name on any object: `__globals__` of a host function gave
    the runtime's module globals and the real builtins. The same logic, each field read
    once (a plugin property could answer differently twice), the name checked as the
    guarded `getattr` checks it."""

    def __get__(self: Any, instance: object, ownerclass: Any = None) -> object:
        if instance is None:
            return get(self, instance, ownerclass)  # the member, or AttributeError
        fget = self.fget
        if fget is not None:
            return fget(instance)
        kind, name = self._attr_type, self.name
        if kind in ("attr", "desc"):
            target = self._cls_type if kind == "attr" else instance._value_  # type: ignore[attr-defined]
            if type(name) is not str:
                raise forbidden("an enum.property may not read that attribute")
            n = norm(name)
            if is_guarded_attr(n) and not (
                is_owned_only_attr(n) and n not in FORMAT_ATTRS and private_ok(target, n)
            ):
                raise forbidden("an enum.property may not read that attribute")
            return getattr(target, n)
        try:
            return ownerclass._member_map_[name]
        except KeyError:
            raise AttributeError(f"{ownerclass!r} has no attribute {name!r}") from None

    return __get__


def _no_signature_text(obj: object, *args: object, **kwargs: object) -> str:
    return "(...)"


def _dataclasses_inspect(real: Any) -> types.SimpleNamespace:
    """The `inspect` dataclasses sees. It calls `inspect.signature(cls)` only to give a class
    without a docstring a `__doc__`, and inspect turns signature text into default values by
    `eval`ing their dotted names in `sys.modules` (a `__signature__` that is text or returns
    text on 3.12+; `__text_signature__` of anything that looks like a method descriptor, e.g.
    a plugin object `functools.wraps` put behind `__init__`): the plugin chose the names, and
    the lookup error of `sys.nope` brought it the `sys` module as its `obj`. The guest never
    reads `__doc__`; after the fork server only plugin classes are decorated here."""
    return types.SimpleNamespace(
        signature=_no_signature_text,
        get_annotations=getattr(real, "get_annotations", None),  # 3.12+ reads annotations
    )


_STDLIB_GUARDS_INSTALLED = False


def install_stdlib_guards() -> None:
    """Worker-only, before sealing: see the module docstring. Irreversible, process-wide."""
    global _STDLIB_GUARDS_INSTALLED  # noqa: PLW0603 - once per worker process
    if _STDLIB_GUARDS_INSTALLED:
        return
    copy._reconstruct = guarded_reconstruct  # type: ignore[attr-defined]
    # The list, tuple and dict copiers take `deepcopy` as a default argument bound at import.
    copy.deepcopy = guarded_deepcopy
    for name in ("_deepcopy_list", "_deepcopy_tuple", "_deepcopy_dict"):
        getattr(copy, name).__defaults__ = (guarded_deepcopy,)
    field_cls: Any = dataclasses.Field
    field_cls.__setattr__ = _write_once_field_name
    field_cls.__delattr__ = _no_field_name_delete
    dataclasses_module: Any = dataclasses
    dataclasses_module._get_field = _exact_field(dataclasses_module._get_field)
    dataclasses_module.inspect = _dataclasses_inspect(dataclasses_module.inspect)
    # The module globals, for dataclasses' own callers (`asdict`/`astuple` through
    # `_asdict_inner`, a frozen slotted class's `__getstate__`, `__replace__` on 3.13); the
    # facade hands out the same functions.
    dataclasses_module.fields = guarded_fields
    dataclasses_module.replace = guarded_replace
    if hasattr(dataclasses_module, "_replace"):
        dataclasses_module._replace = guarded_replace_method

    meta: Any = enum.EnumType
    create = meta._create_

    def _create_(cls: object, *args: object, **kwargs: object) -> object:
        if "names" in kwargs:
            kwargs["names"] = _checked_enum_names(kwargs["names"])
        elif len(args) >= 2:
            args = (args[0], _checked_enum_names(args[1]), *args[2:])
        return create(cls, *args, **kwargs)

    meta._create_ = _create_

    user_dict: Any = collections.UserDict
    user_dict.__copy__ = _checked_user_copy(lambda data: data.copy())
    user_list: Any = collections.UserList
    user_list.__copy__ = _checked_user_copy(lambda data: data[:])

    user_string: Any = collections.UserString
    for method in ("format", "format_map"):
        setattr(user_string, method, _checked_user_string(method))

    cached_property: Any = functools.cached_property
    cached_property.__get__ = _checked_cached_property(cached_property.__get__)

    enum_property: Any = enum.property
    if "_attr_type" in enum_property.__dict__:  # 3.11's __get__ reads `_member_map_` only
        enum_property.__get__ = _checked_enum_property(enum_property.__get__)

    abc_meta: Any = abc.ABCMeta
    register = abc_meta.register

    def register_(cls: type, subclass: type) -> type:
        if cls not in PLUGIN_CLASSES:
            raise SuaveplanError(
                "SAND_VM_GLOBALS_FROZEN", "only the plugin's own ABCs accept registrations"
            )
        return register(cls, subclass)  # type: ignore[no-any-return]

    abc_meta.register = register_
    _STDLIB_GUARDS_INSTALLED = True
