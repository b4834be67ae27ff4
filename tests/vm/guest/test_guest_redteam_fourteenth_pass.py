"""Fourteenth red-team pass on the in-interpreter layer: allowlisted standard-library code
calling back into plugin objects, and trusted methods called with what they did not expect.

One real escape:

1. **A trusted method called unbound, with a class as `self`.** A class's own function is a
   plain function when read off the class (`collections.UserString.upper`, a property's
   `fget`), and Python does not check what it is called with, as C methods do. Trusted code
   written for its own instances makes "another one like `self`" with `self.__class__(...)`
   or `type(self)(...)`, and for a class that is its metaclass: `UserString.upper(C)`
   returned `type(C.data.upper())`, the unguarded `type()` of whatever the plugin's `upper`
   answered (`abc.ABCMeta`, whose three-argument call built an ABC matching a host function
   with `__match_args__ = ("__globals__",)`: the real builtins); `ChainMap.new_child(C,
   name)` called the real `type(name, *C.maps)`, `ChainMap.parents.fget(C)` likewise, and
   `enum.DynamicClassAttribute.getter(T, ...)` called `type(T)` with four values of the
   plugin's (for a TypedDict class, a class built from any namespace). 3.11-3.13. In the
   worker every public method (and property accessor) of the shared classes whose code
   reads `__class__` or names `type` now runs only on a `self` whose class the guarded
   `type()` hands out (`dyncode_unbound_method_class_as_self` in the escape corpus).

A hardening gap closed: two classes C modules make as heap types were reachable and still
mutable, a change persisting across calls in the worker: `time.struct_time`
(`datetime.timetuple()`) and `_abc._abc_data` (an ABC's own `_abc_impl`). Both modules are
sealed now (`test_guest_sealing_sweep.py` walks them).

Pinned probes that were already contained: `re.Scanner` actions and `re.sub` callables get a
`Match` (its `re`, `string` and groups are the plugin's own data); `json` hooks
(`object_pairs_hook`, `default`, `parse_float`) get decoded values and the plugin's objects;
`typing.get_overloads` finds no trusted overloads; `functools.recursive_repr` reads a
`GenericAlias`'s forwarded dunders into a trusted wrapper, and `functools.wraps` then copies
only strings (no `__wrapped__` or dict entry the plugin could not read); a class with a
`__module__` that compares equal to a trusted module's name gives dataclasses that module's
globals for generated dunder methods the plugin cannot fetch; an Enum whose `__new__`
returns a foreign object makes enum call that object's `__init__` and set `_name_` on it,
which re-initialises nothing trusted code relies on; `typing.final`/`override` mark foreign
functions with fixed dunder flags nothing reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _redteam_support import create_plugin, create_plugin_without_the_layer, outcome

PLUGIN_ERROR = "SAND_VM_PLUGIN_ERROR"

ROUTES = """
import collections
import dataclasses
import enum
import functools
import hmac
import json
import random
import re
import typing

U = "_" * 2


class Box:
    target = None

    def upper(self):
        return Box.target


class Holder:
    data = Box()
    maps = [(), {"x": 1}]


def leaked_type_through_user_string():
    Box.target = typing.get_origin(typing.Hashable)
    return repr(collections.UserString.upper(Holder))


def leaked_type_of_a_plugin_class():
    Box.target = Holder
    return repr(collections.UserString.upper(Holder))


def class_built_by_chain_map_new_child():
    made = collections.ChainMap.new_child(Holder, "Made")
    return [repr(made), made.x]


def class_built_by_chain_map_parents():
    made = collections.ChainMap.parents.fget(Holder)
    return repr(made)


def class_built_by_dynamic_class_attribute():
    class T(typing.TypedDict):
        fset = ()
        fdel = {U + "match_args" + U: (U + "globals" + U,)}
        overwrite_doc = False

    made = enum.DynamicClassAttribute.getter(T, "Made")
    return repr(made)


def class_built_by_counter_copy():
    return repr(collections.Counter.copy(Holder))


def methods_keep_working():
    us = collections.UserString("ab")
    cm = collections.ChainMap({"a": 1}, {"b": 2})
    prop = enum.property(lambda self: 1).getter(lambda self: 2)
    alias = typing.List[typing.TypeVar("T")][int]
    mac = hmac.new(b"k", b"m", "sha256").copy()
    rng = random.Random(1)
    rng.seed(2)
    try:
        json.JSONEncoder().default(object())
    except TypeError as exc:
        default = repr(type(exc))

    class Mine:
        def __init__(self, data="xy"):
            self.data = data

    return [
        str(us.upper()),
        str(collections.UserString.upper(us)),
        collections.UserString.upper(Mine()).data,
        dict(cm.new_child({"c": 3})),
        dict(cm.parents),
        dict(collections.Counter("aab").copy()),
        collections.UserList([1]).copy() == [1],
        repr(type(prop)),
        repr(alias),
        len(mac.hexdigest()),
        default,
    ]


def scanner_and_sub_callbacks():
    seen = []

    def action(scanner, token):
        seen.append(repr(type(scanner.match)))
        return token

    tokens, rest = re.Scanner([(r"\\w+", action), (r"\\s+", None)]).scan("ab cd")
    subbed = re.sub(r"(\\w)", lambda m: m.group(1).upper() + m.string[:0], "ab")
    return [tokens, rest, seen, subbed]


def json_hooks():
    pairs = json.loads('{"a": [1.5]}', object_pairs_hook=lambda p: ["pairs", p])
    floats = json.loads("[1.5]", parse_float=lambda s: ["float", s])
    default = json.dumps({"x": {1}}, default=lambda o: sorted(o))
    return [pairs, floats, default]


def overloads_of_trusted_code():
    def mine():
        pass

    functools.wraps(typing.GenericAlias(json.loads, ()))(mine)
    return [typing.get_overloads(mine), repr(mine)[:14]]


def recursive_repr_wrapper():
    wrapper = functools.recursive_repr()(typing.GenericAlias(json.loads, ()))

    def mine():
        pass

    functools.wraps(wrapper)(mine)
    return repr(mine)[:14]


def dataclass_of_a_class_with_a_foreign_module_name():
    class Name:
        def __hash__(self):
            return hash("json")

        def __eq__(self, other):
            return other == "json"

    made = collections.namedtuple("Made", "a", module=Name())
    return repr(dataclasses.dataclass(made))


def enum_member_made_from_a_foreign_object():
    target = json.JSONDecoder()

    class Members(enum.Enum):
        def __new__(cls, *args):
            return target

        ONE = ()

    return [Members.ONE is target, target.strict]
"""


@pytest.mark.parametrize(
    "name",
    [
        "leaked_type_through_user_string",
        "leaked_type_of_a_plugin_class",
        "class_built_by_chain_map_new_child",
        "class_built_by_chain_map_parents",
        "class_built_by_dynamic_class_attribute",
        "class_built_by_counter_copy",
    ],
)
async def test_a_trusted_method_never_runs_on_a_class_as_self(tmp_path: Path, name: str) -> None:
    async with await create_plugin(tmp_path, ROUTES, name="redteam14") as sb:
        # Was `<class 'abc.ABCMeta'>` / `<class 'type'>` / a class built by the real `type`
        # (or `_TypedDictMeta`) from the plugin's namespace.
        assert await outcome(sb, name) == PLUGIN_ERROR
        with pytest.raises(Exception) as info:
            await sb.call(name)
        assert getattr(info.value, "code", None) == PLUGIN_ERROR
        assert info.value.details["type"] == "TypeError"  # type: ignore[attr-defined]
        assert "runs on an instance of its class only" in str(
            info.value.details["message"]  # type: ignore[attr-defined]
        )


async def test_the_guarded_methods_keep_working_on_instances(tmp_path: Path) -> None:
    async with await create_plugin(tmp_path, ROUTES, name="redteam14") as sb:
        assert await sb.call("methods_keep_working") == [
            "AB",
            "AB",
            "XY",
            {"c": 3, "a": 1, "b": 2},
            {"b": 2},
            {"a": 2, "b": 1},
            True,
            "<class 'enum.property'>",
            "typing.List[int]",
            64,
            "<class 'TypeError'>",
        ]


async def test_callbacks_of_the_standard_library_get_only_the_plugins_data(
    tmp_path: Path,
) -> None:
    async with await create_plugin(tmp_path, ROUTES, name="redteam14") as sb:
        assert await sb.call("scanner_and_sub_callbacks") == [
            ["ab", "cd"],
            "",
            ["<class 're.Match'>", "<class 're.Match'>"],
            "AB",
        ]
        assert await sb.call("json_hooks") == [
            ["pairs", [["a", [1.5]]]],
            [["float", "1.5"]],
            '{"x": [1]}',
        ]


async def test_pinned_probes_stay_contained(tmp_path: Path) -> None:
    async with await create_plugin(tmp_path, ROUTES, name="redteam14") as sb:
        assert await sb.call("overloads_of_trusted_code") == [[], "<function load"]
        assert await sb.call("recursive_repr_wrapper") == "<function load"
        assert await sb.call("dataclass_of_a_class_with_a_foreign_module_name") == "<class 'Made'>"
        assert await sb.call("enum_member_made_from_a_foreign_object") == [True, True]


SWEEP = """
import types

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._guest import _runtime
from suaveplan_sandbox.vm._guest._seal import is_prepared, shared_classes


def _functions(value):
    if type(value) is types.FunctionType:
        return [value]
    if type(value) is property:
        return [f for f in (value.fget, value.fset, value.fdel) if type(f) is types.FunctionType]
    return []


def _computing(classes):
    guard = _runtime._on_instances_only(lambda self: None).__code__
    out = []
    for cls in classes:
        for name, value in vars(cls).items():
            if not isinstance(name, str) or name.startswith("_"):
                continue
            for f in _functions(value):
                code = f.__code__
                if code is not guard and code.co_argcount + code.co_posonlyargcount:
                    if _runtime._computes_a_class(code):
                        out.append(cls.__module__ + "." + cls.__qualname__ + "." + name)
    return sorted(out)


def unguarded():
    if not is_prepared():
        return ["the worker was not prepared"]
    shared = [c for c in shared_classes() if c.__module__.split(".")[0] != "suaveplan_sandbox"]
    own = [SuaveplanError, _runtime.Response, _runtime.Facade, _runtime.GuardedType]
    return [_computing(shared), _computing(own), len(shared)]
"""


async def test_every_shared_method_computing_its_class_is_guarded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the layer off: the walk reads code objects.
    async with await create_plugin_without_the_layer(
        tmp_path, monkeypatch, SWEEP, name="sweep14"
    ) as sb:
        result = await sb.call("unguarded")
    assert isinstance(result, list)
    shared, own, count = result
    assert shared == []
    assert own == []  # the worker's own guest-facing classes compute no class of `self`
    assert count > 250
