"""Fifteenth red-team pass on the in-interpreter layer: the fourteenth pass's class of bug
generalised (trusted code computing `type(x)`/`x.__class__` of what the plugin chose, a class
included, so the result is a metaclass) beyond the public methods that fix covers.

No real escape was found in this pass. Probed, and pinned below as contained:

* **Module-level functions of the allowlisted modules** that compute a class (a code scan
  of every public function, nested code included, on 3.11-3.13): `json.loads` and
  `typing.reveal_type` only name it in a message; `dataclasses.is_dataclass` only tests it;
  `enum.global_str`/`global_enum_repr`/`global_flag_repr` with a class as `self` format the
  metaclass's *name* (`"type(3)"`); `typing.no_type_check` reads every attribute of a class
  (its `__class__` too) but hands nothing out; `namedtuple`, `dataclasses.replace`,
  `singledispatch`, `get_type_hints` and `pickle_by_enum_name` were already guarded or
  excluded from the facades.
* **Indirect class computation.** The only public method of a shared class whose code does
  not name the class but calls a module helper that does is `json.JSONEncoder.iterencode`
  (`_make_iterencode` names `__class__` only in an error message): called unbound with a
  class as `self`, it encodes with the plugin's own settings and `default`. Helpers reached
  through `self.<name>` resolve on the plugin's own object, so they are the plugin's code.
  `Counter.update` called unbound with a `Counter` subclass (a class) as `self` binds
  `super()` to the class and fails with a `TypeError`.
* **Class and static methods** computing a class (scan of every shared class):
  `Fraction.from_float`/`from_decimal` name it in a message only (a class passed in gives
  `"(type)"`), and a plugin subclass's `cls` is the plugin's class; the dunder ones
  (`Generic`/`Protocol.__init_subclass__`, `Enum`/`Fraction.__new__`) compare it only.
* **Unusual `self`.** A `types.GenericAlias` over a plugin class as `self` of a guarded
  method passes the guard (its class is handed out) but its `__class__` is `GenericAlias`
  (3.11+ no longer forwards it), so "another one like `self`" fails to build.
* **Hashed keys holding a metaclass.** `functools.lru_cache(typed=True)` puts
  `type(arg)` (the real `type` for a class argument) in its key, and a dict lookup compares
  keys element by element with the plugin's `__eq__`; but a comparison needs equal 64-bit
  hashes of whole keys that contain the real `type` and the cache's private marker, which
  the plugin cannot compute, and no key is ever handed out. (The sixteenth pass computed both
  and got the real `type`: the guest's `lru_cache` now refuses `typed=True`.)
* `functools.total_ordering`'s generated methods compute `type(self)` of the plugin's
  own instances only (the plugin cannot fetch them off the class: dunder names).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _redteam_support import create_plugin

ROUTES = """
import collections
import enum
import fractions
import functools
import json
import typing


class Box:
    target = None

    def upper(self):
        return Box.target


class Holder:
    data = Box()
    check_circular = False
    ensure_ascii = True
    allow_nan = True
    indent = None
    key_separator = ":"
    item_separator = ","
    sort_keys = False
    skipkeys = False

    @staticmethod
    def default(o):
        return repr(o)


def generic_alias_as_self():
    Box.target = "x"
    ga = type(list[int])(Holder, ())
    try:
        return repr(collections.UserString.upper(ga))
    except TypeError as exc:
        return "TypeError " + str(exc)[:60]


def encoder_iterencode_class_self():
    return list(json.JSONEncoder.iterencode(Holder, {"a": [1, object]}))


def fraction_subclass_classmethods():
    class F(fractions.Fraction):
        pass

    try:
        fractions.Fraction.from_float(Holder)
    except TypeError as exc:
        err = str(exc)
    return [repr(type(F.from_float(0.5))), repr(type(F.from_decimal(1))), err]


def counter_update_class_self():
    class C(collections.Counter):
        pass

    out = []
    for arg in ({"a": 1}, "ab"):
        try:
            out.append(repr(collections.Counter.update(C, arg)))
        except Exception as exc:
            out.append(repr(type(exc)))
    return out


def no_type_check_of_a_class():
    class C:
        def f(self):
            return 1

    return [typing.no_type_check(C) is C, C().f()]


def enum_reprs_of_a_class():
    class E:
        _name_ = None
        _value_ = 3

    return [enum.global_str(E), enum.global_enum_repr(E)]


def typed_cache_of_classes():
    seen = []

    @functools.lru_cache(typed=True)
    def f(*args, **kw):
        return len(args)

    class Eq:
        def __eq__(self, other):
            seen.append(repr(other))
            return True

        def __hash__(self):
            return 1

    f(Holder, Eq())
    f(k=Eq())
    return [f.cache_info().currsize, seen]


def total_ordering_methods():
    @functools.total_ordering
    class O:
        def __init__(self, v):
            self.v = v

        def __lt__(self, other):
            return self.v < other.v

        def __eq__(self, other):
            return self.v == other.v

    return [O(2) > O(1), O(1) >= O(1)]
"""


async def test_module_functions_computing_a_class_hand_out_no_metaclass(tmp_path: Path) -> None:
    async with await create_plugin(tmp_path, ROUTES, name="redteam15") as sb:
        assert await sb.call("no_type_check_of_a_class") == [True, 1]
        # The metaclass's name only, formatted into a string.
        assert await sb.call("enum_reprs_of_a_class") == ["type(3)", "builtins.None"]


async def test_indirect_and_class_methods_stay_on_the_plugins_values(tmp_path: Path) -> None:
    async with await create_plugin(tmp_path, ROUTES, name="redteam15") as sb:
        assert await sb.call("encoder_iterencode_class_self") == [
            "{",
            '"a"',
            ":",
            "[1",
            ",",
            "\"<class 'object'>\"",
            "]",
            "}",
        ]
        assert await sb.call("counter_update_class_self") == [
            "<class 'TypeError'>",
            "<class 'TypeError'>",
        ]
        local = "<class 'plugin.fraction_subclass_classmethods.<locals>.F'>"
        assert await sb.call("fraction_subclass_classmethods") == [
            local,
            local,
            "Fraction.from_float() only takes floats, not <class 'plugin.Holder'> (type)",
        ]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("generic_alias_as_self", "TypeError GenericAlias expected 2 arguments, got 1"),
        ("total_ordering_methods", [True, True]),
    ],
)
async def test_unusual_self_and_keys_stay_contained(
    tmp_path: Path, name: str, expected: object
) -> None:
    async with await create_plugin(tmp_path, ROUTES, name="redteam15") as sb:
        assert await sb.call(name) == expected


async def test_a_typed_cache_is_refused(tmp_path: Path) -> None:
    # See test_guest_redteam_sixteenth_pass.py: typed keys were reachable after all.
    async with await create_plugin(tmp_path, ROUTES, name="redteam15") as sb:
        with pytest.raises(Exception) as info:
            await sb.call("typed_cache_of_classes")
        assert getattr(info.value, "code", None) == "SAND_VM_INDIRECT_EVAL_REJECTED"
