"""Eleventh red-team pass on the in-interpreter layer: trusted code calling what the plugin
chose with what trusted code holds, hunted hook by hook (rich comparisons and hashing on
collisions, numeric conversions, descriptors and class-creation hooks, `__exit__`, copy's
reduce/state hooks, dataclass and Enum hooks, `ExceptionGroup` predicates) and, the other
way round, trusted code handing the plugin what it computed from the plugin's values.

Two real escapes:

1. **statistics computed the real `type()` for the plugin.** `statistics` groups its data by
   the real `type`, coerces the classes it found to one (`_coerce`) and converts its exact
   total with that class (`_convert`: `T(value)`). A class in the data (its
   `as_integer_ratio` and `is_finite` static methods saying "not finite") made the real `type`
   the target, a plugin `int` subclass's arithmetic chose the total, and `mean()` returned
   `type(total)` of any object, unguarded: `types.FunctionType` of a host function,
   `abc.ABCMeta` of an ABC, whose three-argument call built a class from any namespace (an
   ABC admitting a host function with `__match_args__ = ("__globals__",)`: the real
   builtins). 3.11-3.13. statistics now coerces only to classes the guarded `type()` hands
   out (anything else is its own `TypeError`).
2. **copy gave `functools.partial` a namespace that is not a dict.** A plugin's
   `__reduce__` chooses the callable and the state copy reconstructs with; for a real
   `functools.partial` the state's fourth item becomes the instance `__dict__`, and the C
   `__setstate__` never checks it is a dict. On 3.11-3.12 attribute access then fails with
   `SystemError`; on 3.13 setting an attribute treats the object as a dict (a bytearray's
   bytes as the dict's keys pointer: memory corruption in the worker). The partial's
   namespace must now be a dict (or None), checked like the rest of copy's state.

A leftover closed as hardening (no escape found through it): a decorated dunder method may
now only be the plugin's own function (or its property, class or static method), and
typing's overload stub: `__exit__` (handed a traceback), `__eq__` and the other hooks
trusted code calls with what it holds ran any function the plugin could name.

Pinned probes that were already contained (they fail closed or are harmless): trusted
private values written into plugin class dicts (Enum's `_new_member_`, random's
`_randbelow`, abc's `_abc_impl`) are each harmless; a class statement on an instance of a
type `type()` refuses calls that type with (name, bases, namespace) and fails;
`ExceptionGroup.split`/`subgroup` hand the predicate only exceptions the plugin put in the
group; a plugin `int` in `re.RegexFlag`'s shared table stays in that worker; and 3.13's
`__replace__` of classes decorated before the guards has no caller a plugin can reach.
"""

from __future__ import annotations

import copy
import enum
import random
import types
from pathlib import Path

import pytest
from _redteam_support import create_plugin, outcome

from suaveplan_sandbox.vm import VmSandbox
from suaveplan_sandbox.vm._guest._policy import ALLOWED_MODULES
from suaveplan_sandbox.vm._guest._runtime import _type_handed_out, module_facade

FORBIDDEN = "SAND_VM_ATTRIBUTE_FORBIDDEN"

ROUTES = """
import collections
import dataclasses
import decimal
import enum
import fractions
import functools
import random
import re
import statistics
import typing

from suaveplan import fs


class Element:
    # A class in the data: `type(Element)` is the real `type`, statistics' coercion target.
    @staticmethod
    def as_integer_ratio():
        raise ValueError("not finite")

    @staticmethod
    def is_finite():
        return False


class Total(int):
    target = None

    def as_integer_ratio(self):
        raise ValueError("not finite")

    def is_finite(self):
        return False

    def __radd__(self, other):
        return self

    def __add__(self, other):
        return self

    def __truediv__(self, other):
        return Total.target

    def __sub__(self, other):
        return self

    def __mul__(self, other):
        return self


def _type_through(function, obj):
    Total.target = obj
    try:
        return repr(function([Total(0), Element]))
    except TypeError:
        return "TypeError"


def type_of_a_host_function_through_mean():
    return _type_through(statistics.mean, fs.read_text)


def metaclass_of_an_abc_through_mean():
    return _type_through(statistics.mean, typing.get_origin(typing.Hashable))


class Money(fractions.Fraction):
    pass


def statistics_keeps_working():
    return [
        statistics.mean([1, 2, 3, 4]),
        statistics.mean([1, 2.5]),
        repr(statistics.mean([fractions.Fraction(1, 3), fractions.Fraction(2, 3)])),
        repr(statistics.mean([decimal.Decimal("1.5"), decimal.Decimal("2.5")])),
        statistics.mean([True, False, True, True]),
        repr(statistics.mean([Money(1, 2), Money(3, 2)])),
        statistics.variance([1, 2, 3, 4]),
        round(statistics.stdev([1.0, 2.0, 4.0]), 6),
        statistics.pvariance([2, 4]),
        statistics.harmonic_mean([1, 2, 4]),
        statistics.median([3, 1, 2]),
        repr(statistics.mean([float("nan"), 1.0])),
    ]


def target(*args):
    return args


class Namespace:
    def keys(self):
        return ["x"]

    def __getitem__(self, key):
        return 1


class Partial(functools.partial):
    namespace = None

    def __reduce__(self):
        return (functools.partial, (target,), (target, (), None, Partial.namespace))


@dataclasses.dataclass
class Box:
    item: object


def _partial_with_namespace(namespace):
    Partial.namespace = namespace
    return dataclasses.asdict(Box(Partial(target)))["item"]


def partial_namespace_a_list():
    copied = _partial_with_namespace([1, 2])
    copied.x = 1
    return copied.x


def partial_namespace_a_bytearray():
    copied = _partial_with_namespace(bytearray(64))
    copied.x = 1
    return copied.x


def partial_namespace_a_mapping():
    return repr(_partial_with_namespace(Namespace()))


def partial_namespace_a_dict_subclass():
    copied = _partial_with_namespace(collections.OrderedDict(a=1))
    return [copied.a, copied(2)]


def partials_keep_copying():
    p = functools.partial(target, 1)
    p.note = "kept"
    copied = dataclasses.asdict(Box(p))["item"]
    no_namespace = dataclasses.asdict(Box(functools.partial(target, 3)))["item"]
    return [copied is not p, copied(2), copied.note, no_namespace(4)]


# -- dunder methods that are someone else's function ----------------------------------------


def load_a_class_with_a_foreign_exit():
    class Foreign:
        @(lambda method: staticmethod(collections.UserList.append))
        def __exit__(self, *exc):
            pass

    return "made"


def load_a_class_with_a_foreign_eq():
    class Foreign:
        @(lambda method: collections.UserList.append)
        def __eq__(self, other):
            pass

    return "made"


def load_a_class_with_a_foreign_property():
    class Foreign:
        @(lambda method: property(collections.UserList.copy))
        def __len__(self):
            pass

    return "made"


class Overloaded:
    @typing.overload
    def __getitem__(self, index: int) -> int: ...

    @typing.overload
    def __getitem__(self, index: str) -> str: ...

    def __getitem__(self, index):
        return index

    @property
    def __len__(self):
        return lambda: 3

    @staticmethod
    def __call__(x):
        return x * 2

    @classmethod
    def __class_getitem__(cls, item):
        return item

    @functools.wraps(target)
    def __repr__(self):
        return "wrapped"


def own_dunder_methods_keep_working():
    o = Overloaded()
    return [o[1], o["a"], len(o), o(4), Overloaded[int] is int, repr(o)]


# -- probes that were already contained -----------------------------------------------------


class Mark(int):
    def __eq__(self, other):
        return int(self) == other

    def __hash__(self):
        return hash(int(self))


def regex_flag_made_from_a_plugin_int():
    return repr(type(re.RegexFlag(Mark(1 << 20)).value))


def regex_flag_seen_in_a_later_call():
    return repr(type(re.RegexFlag(1 << 20).value))


def _generator():
    yield 1


class Catch:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        self.tb = tb
        return True

    def close(self):
        pass


def _traceback():
    catch = Catch()
    with catch:
        fs.read_text(1, 2, 3)
    return catch.tb


def _class_on(base):
    try:

        class Made(base):
            pass

    except TypeError:
        return "TypeError"
    return repr(Made)


def class_statements_on_instances_of_refused_types():
    return [
        _class_on(fs.read_text),
        _class_on(_generator()),
        _class_on("text".upper),
        _class_on(_traceback()),
        _class_on(Catch().close),
    ]


def exception_group_predicates_see_only_the_plugins_exceptions():
    leaves = [ValueError("a"), KeyError("b")]
    inner = ExceptionGroup("inner", [TypeError("c")])
    group = ExceptionGroup("outer", [*leaves, inner])
    seen = []

    def predicate(exc):
        seen.append(exc)
        return isinstance(exc, ValueError)

    group.split(predicate)
    group.subgroup(predicate)
    held = [group, inner, *leaves, *inner.exceptions]
    return [len(seen) > 0, all(any(s is h for h in held) for s in seen)]


class Color(enum.Enum):
    RED = 1


class Generator(random.Random):
    def random(self):
        return 0.5


def foreign_private_values_in_plugin_classes():
    return [
        repr(Color._new_member_),
        repr(Color._generate_next_value_("X", 1, 0, [])),
        Generator()._randbelow(10),
    ]


def reveal_type_writes_nowhere():
    try:
        typing.reveal_type(1)
    except OSError:
        return "OSError"
    return "written"
"""


async def _create(tmp_path: Path, source: str = ROUTES) -> VmSandbox:
    return await create_plugin(tmp_path, source, name="redteam11")


# -- 1. statistics ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "type_of_a_host_function_through_mean",
        "metaclass_of_an_abc_through_mean",
    ],
)
async def test_statistics_never_converts_with_a_class_type_refuses(
    tmp_path: Path, name: str
) -> None:
    async with await _create(tmp_path) as sb:
        # Was `<class 'function'>` / `<class 'abc.ABCMeta'>`: the unguarded `type()`.
        assert await sb.call(name) == "TypeError"


async def test_statistics_keeps_working(tmp_path: Path) -> None:
    async with await _create(tmp_path) as sb:
        assert await sb.call("statistics_keeps_working") == [
            2.5,
            1.75,
            "Fraction(1, 2)",
            "Decimal('2')",
            0.75,
            "Money(1, 1)",
            pytest.approx(5 / 3),
            pytest.approx(1.527525),
            1,
            pytest.approx(12 / 7),
            2,
            "nan",
        ]


# -- 2. functools.partial's namespace --------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["partial_namespace_a_list", "partial_namespace_a_bytearray", "partial_namespace_a_mapping"],
)
async def test_a_copy_never_gives_a_partial_a_namespace_that_is_not_a_dict(
    tmp_path: Path, name: str
) -> None:
    async with await _create(tmp_path) as sb:
        # Was a partial whose `__dict__` is the list (SystemError on 3.11-3.12; on 3.13
        # setting an attribute read the bytes as a dict's internals and the worker died).
        assert await outcome(sb, name) == FORBIDDEN
        assert await sb.call("partials_keep_copying") == [True, [1, 2], "kept", [3, 4]]


async def test_a_dict_subclass_namespace_reaches_a_partial_as_a_checked_dict(
    tmp_path: Path,
) -> None:
    async with await _create(tmp_path) as sb:
        assert await sb.call("partial_namespace_a_dict_subclass") == [1, [2]]


# -- 3. dunder methods are the plugin's own functions ----------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "load_a_class_with_a_foreign_exit",
        "load_a_class_with_a_foreign_eq",
        "load_a_class_with_a_foreign_property",
    ],
)
async def test_a_dunder_method_may_not_be_someone_elses_function(tmp_path: Path, name: str) -> None:
    async with await _create(tmp_path) as sb:
        assert await outcome(sb, name) == FORBIDDEN


async def test_the_plugins_own_dunder_methods_keep_working(tmp_path: Path) -> None:
    async with await _create(tmp_path) as sb:
        assert await sb.call("own_dunder_methods_keep_working") == [1, "a", 3, 8, True, "wrapped"]


# -- probes that were already contained ------------------------------------------------------


async def test_a_plugin_int_in_a_shared_enum_table_stays_in_its_worker(tmp_path: Path) -> None:
    async with await _create(tmp_path) as sb:
        assert await sb.call("regex_flag_made_from_a_plugin_int") == "<class 'plugin.Mark'>"
        # Process state, like the plugin's globals: it persists across calls of this
        # sandbox; no trusted code of the worker decides anything with `re` or an Enum.
        assert await sb.call("regex_flag_seen_in_a_later_call") == "<class 'plugin.Mark'>"
    other = tmp_path / "other"
    other.mkdir()
    async with await _create(other) as sb:
        assert await sb.call("regex_flag_seen_in_a_later_call") == "<class 'int'>"


async def test_a_class_statement_on_an_instance_of_a_refused_type_fails(tmp_path: Path) -> None:
    async with await _create(tmp_path) as sb:
        # `__build_class__` calls the base's type with (name, bases, namespace): none of the
        # types `type()` refuses accepts that.
        assert await sb.call("class_statements_on_instances_of_refused_types") == ["TypeError"] * 5


async def test_exception_group_predicates_see_only_what_the_plugin_put_in(
    tmp_path: Path,
) -> None:
    async with await _create(tmp_path) as sb:
        assert await sb.call("exception_group_predicates_see_only_the_plugins_exceptions") == [
            True,
            True,
        ]


async def test_trusted_values_in_plugin_class_dicts_are_harmless(tmp_path: Path) -> None:
    async with await _create(tmp_path) as sb:
        values = await sb.call("foreign_private_values_in_plugin_classes")
    assert isinstance(values, list)
    new_member, next_value, below = values
    assert new_member.startswith("<built-in method __new__ of type object")
    assert next_value == "1"
    assert 0 <= below < 10


# What trusted code writes, under a name the plugin may read (a `_private` name or `obj`),
# into the namespace of a plain subclass of a facade class (3.11-3.13): each is plain data,
# a class `type()` hands out, enum's or random's own helpers (a member constructor, a value
# generator, the bounded-random choice) or abc's opaque cache.
_HARMLESS_FOREIGN_VALUES = {
    "_abc_impl": "_abc_data",
    "_is_protocol": "bool",
    "_new_member_": "builtin_function_or_method|function",
    "_generate_next_value_": "function|staticmethod",
    "_use_args_": "bool",
    "_member_names_": "list",
    "_member_map_": "dict",
    "_value2member_map_": "dict",
    "_unhashable_values_": "list",
    "_unhashable_values_map_": "dict",
    "_member_type_": "type",
    "_value_repr_": "NoneType|wrapper_descriptor",
    "_boundary_": "FlagBoundary",
    "_flag_mask_": "int",
    "_singles_mask_": "int",
    "_all_bits_": "int",
    "_inverted_": "NoneType",
    "_randbelow": "function",
}


def _harmless(key: str, value: object) -> bool:
    if type(value).__name__ not in _HARMLESS_FOREIGN_VALUES.get(key, "").split("|"):
        return False
    if isinstance(value, type):
        return _type_handed_out(value)
    func = value.__func__ if isinstance(value, staticmethod) else value
    if isinstance(func, types.FunctionType):
        return func.__module__ in ("enum", "random")
    return True


def _facade_classes() -> list[type]:
    out = []
    for name in sorted(ALLOWED_MODULES - {"suaveplan"}):
        content = object.__getattribute__(module_facade(name), "_sp_content")
        out += [v for _, v in sorted(content.items()) if isinstance(v, type)]
    return out


def _subclass(base: type) -> type | None:
    namespace: dict[str, object] = {}
    if issubclass(base, random.Random):
        namespace["random"] = lambda self: 0.5  # random picks `_randbelow` by this
    try:
        if issubclass(base, enum.Enum):
            if base.__members__:
                return None  # an Enum with members cannot be extended
            made: type = base("Sub", {})  # type: ignore[call-arg,assignment]
            return made
        return types.new_class("Sub", (base,), {}, lambda ns: ns.update(namespace))
    except TypeError:
        return None


def test_trusted_code_writes_only_harmless_private_values_into_plugin_classes() -> None:
    unexpected = {}
    for base in _facade_classes():
        sub = _subclass(base)
        if sub is None:
            continue
        for key, value in vars(sub).items():
            if not (key.startswith("_") and not key.startswith("__")) and key != "obj":
                continue
            if not _harmless(key, value):
                unexpected[f"{base.__qualname__}.{key}"] = repr(value)
    assert not unexpected, unexpected


async def test_reveal_type_reaches_no_stream_of_the_host(tmp_path: Path) -> None:
    async with await _create(tmp_path) as sb:
        # The worker has no stderr: typing's real `print` fails, nothing reaches the host.
        assert await sb.call("reveal_type_writes_nowhere") == "OSError"


def test_nothing_a_plugin_holds_calls_replace_on_classes_decorated_before_the_guards() -> None:
    # 3.13 dataclasses install `__replace__` (the original `_replace` on classes made before
    # the worker's guards, e.g. the runtime's `Response`); only `copy.replace` calls it, a
    # dunder the guest cannot name, in a module it cannot import or reach through a facade.
    assert "copy" not in ALLOWED_MODULES
    replace = getattr(copy, "replace", None)
    for name in sorted(ALLOWED_MODULES - {"suaveplan"}):
        content = object.__getattribute__(module_facade(name), "_sp_content")
        assert all(v is not replace or replace is None for v in content.values()), name
