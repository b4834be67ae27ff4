"""Ninth red-team pass on the in-interpreter layer: classes of bugs, not instances.

1. **Instance `__dataclass_fields__`.** dataclasses' `fields()`/`replace()` (and `asdict`,
   `astuple`, which call `fields()`) trusted a `__dataclass_fields__` found on the object and
   read each field natively. A shallow copy of a plugin object handed the plugin's own
   `__setstate__` the original's real instance dict (object's `__getstate__` returns it), and
   a dict *subclass* as state went unchecked to `BaseException.__setstate__`: both planted one
   (`format` read off a `str` subclass: the unguarded `str.format`). Copies now hand
   `__setstate__` only copies and check subclasses too, and the readers use only the class's
   own fields, each name one the plugin may read on an instance.
2. **Spoofed `__class__`/`__dict__`.** dataclasses' generated `__eq__` and ordering compare
   `other.__class__ is self.__class__`, then read every field, private ones included, from
   the other object: a plugin answering `ForwardRef` there (a property, or its own
   `__getattribute__`) was handed `ForwardRef._evaluate` (an `eval` with the real builtins).
   A class's own `__class__`/`__dict__` now raise when used, and its `__getattribute__` and
   `__getattr__` never answer those two names.

Each route ran in real workers on 3.11-3.13 before its fix (the escape corpus carries the
attacks: `format_copy_setstate_real_instance_dict`, `mutate_copy_setstate_dict_subclass`,
`class_dataclass_eq_spoofed_class`, `class_dataclass_eq_getattribute_class`).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from _redteam_support import create_plugin, outcome

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm import VmSandbox
from suaveplan_sandbox.vm._guest._guards import guarded_fields, guarded_replace
from suaveplan_sandbox.vm._guest._policy import GUARD_ATTR_HOOK, check_module
from suaveplan_sandbox.vm._guest._runtime import module_facade

FORBIDDEN = "SAND_VM_ATTRIBUTE_FORBIDDEN"

ROUTES = """
import collections
import dataclasses
import functools
import typing

U = "_" * 2
stolen = []


@dataclasses.dataclass
class Named:
    format: str = ""


@dataclasses.dataclass(init=False)
class Target(str):
    def update(self, other):
        pass

    def __setstate__(self, state):
        stolen.append(state)


def setstate_gets_a_copy_of_the_state():
    t = Target("{0." + U + "globals" + U + "}")
    t.data = {}
    collections.UserDict.copy(t)
    state = stolen[-1]
    state["marker"] = 1
    state[U + "dataclass_fields" + U] = {"format": dataclasses.fields(Named)[0]}
    return [sorted(state), hasattr(t, "marker"), dataclasses.asdict(t)]


class State(dict):
    pass


@dataclasses.dataclass(init=False)
class Boom(ValueError):
    note: str = "x"

    def update(self, other):
        pass


class Planter:
    data = None

    def update(self, other):
        pass

    def __reduce_ex__(self, proto):
        forged = dataclasses.field()
        forged.name = U + "setstate" + U
        return (Boom, (), State({U + "dataclass_fields" + U: {"x": forged}}))


def dict_subclass_state_for_a_foreign_setstate():
    collections.UserDict.copy(Planter())
    return "planted"


def _ref(text):
    return typing.get_args(typing.List[text])[0]  # noqa: UP006 - it makes the ForwardRef


FR = type(_ref("x"))
caught = []


class Catch:
    def __eq__(self, other):
        caught.append(other)
        return True


@dataclasses.dataclass(order=True)
class ByProperty:
    _evaluate: object

    @property
    def __class__(self):
        return FR


def eq_with_a_class_property():
    return ByProperty(Catch()) == _ref("open")


answers = {"_evaluate": Catch()}


@dataclasses.dataclass
class ByHook:
    _evaluate: object

    def __getattribute__(self, name):
        if name == U + "class" + U:
            return FR
        return answers[name]


def eq_with_getattribute_answering_class():
    equal = ByHook(1) == _ref("open")
    return [equal, len(caught)]


asked = []


class Fallback(typing.NamedTuple):
    a: int

    def __getattr__(self, name):
        asked.append(name)
        if name == U + "dict" + U:
            return {"planted": 1}
        raise AttributeError(name)


def holder():
    pass


def getattr_never_asked_for_class_or_dict():
    functools.wraps(Fallback(1))(holder)
    return [hasattr(holder, "planted"), [n for n in asked if n in (U + "class" + U, U + "dict" + U)]]


class Mock:
    @property
    def __class__(self):
        return int


def a_class_property_raises_when_used():
    return isinstance(Mock(), int)


@dataclasses.dataclass(order=True)
class Row:
    format: str
    _private: int = 0


class Proxy:
    def __init__(self, target):
        self.target = target

    def __getattribute__(self, name):
        return getattr(proxied[0], name)


proxied = [Row("csv", 1)]


class Lazy:
    def __getattr__(self, name):
        return name.upper()


class Keeper:
    def __init__(self):
        self.data = {}
        self.kept = "yes"

    def update(self, other):
        pass

    def __setstate__(self, state):
        self.got = sorted(state)


def legit():
    row = Row("csv", 2)
    copy = collections.UserDict.copy(Keeper())
    return [
        [f.name for f in dataclasses.fields(row)],
        dataclasses.asdict(row),
        list(dataclasses.astuple(row)),
        dataclasses.replace(row, format="tsv")._private,
        row == Row("csv", 2),
        row < Row("csv", 3),
        Proxy(row).format,
        isinstance(Proxy(row), Proxy),
        Lazy().name,
        copy.got,
    ]
"""


async def _create(tmp_path: Path, source: str) -> VmSandbox:
    return await create_plugin(tmp_path, source, name="redteam9")


async def test_a_plugin_setstate_gets_a_copy_never_the_real_instance_dict(
    tmp_path: Path,
) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await sb.call("setstate_gets_a_copy_of_the_state") == [
            ["__dataclass_fields__", "data", "marker"],
            False,
            {},
        ]


async def test_a_dict_subclass_state_is_checked_for_a_foreign_setstate(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await outcome(sb, "dict_subclass_state_for_a_foreign_setstate") == FORBIDDEN


async def test_dataclass_eq_never_sees_a_class_answered_by_a_property(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await outcome(sb, "eq_with_a_class_property") == FORBIDDEN
        assert await outcome(sb, "a_class_property_raises_when_used") == FORBIDDEN


async def test_a_getattribute_hook_never_answers_class_or_dict(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await sb.call("eq_with_getattribute_answering_class") == [False, 0]
        assert await sb.call("getattr_never_asked_for_class_or_dict") == [False, []]


async def test_dataclasses_hooks_and_copies_keep_working(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await sb.call("legit") == [
            ["format", "_private"],
            {"format": "csv", "_private": 2},
            ["csv", 2],
            2,
            True,
            True,
            "csv",
            True,
            "NAME",
            ["data", "kept"],
        ]


def test_the_policy_wraps_class_and_dict_definitions_and_attribute_hooks() -> None:
    source = textwrap.dedent(
        """
        class C:
            @property
            def __class__(self):
                return int

            def __dict__(self):
                return {}

            def __getattribute__(self, name):
                return 1

            def __getattr__(self, name):
                return 2

            def __repr__(self):
                return "c"
        """
    )
    tree, _ = check_module(source, "plugin.py")
    cls = tree.body[0]
    assert isinstance(cls, __import__("ast").ClassDef)
    hooked = {
        node.name
        for node in cls.body
        if isinstance(node, __import__("ast").FunctionDef)
        and any(
            getattr(getattr(d, "func", None), "id", None) == GUARD_ATTR_HOOK
            for d in node.decorator_list[:1]
        )
    }
    assert hooked == {"__class__", "__dict__", "__getattribute__", "__getattr__"}


# -- the readers themselves: a forged instance `__dataclass_fields__`, planted directly -----


@dataclasses.dataclass
class _Named:
    format: str = ""


@dataclasses.dataclass(init=False)
class _Text(str):
    pass


def _planted() -> Any:
    text = _Text("{0.__globals__}")
    object.__setattr__(text, "__dataclass_fields__", {"format": dataclasses.fields(_Named)[0]})
    return text


def test_guarded_readers_use_the_class_fields_not_an_instance_attribute() -> None:
    text = _planted()
    assert dataclasses.fields(text)  # what the unguarded reader trusts
    assert guarded_fields(text) == ()
    assert guarded_replace(text) == text


def test_guarded_readers_refuse_a_field_the_plugin_could_not_read() -> None:
    class Forged(str):
        pass

    type.__setattr__(Forged, "__dataclass_fields__", {"format": dataclasses.fields(_Named)[0]})
    with pytest.raises(SuaveplanError) as err:
        guarded_fields(Forged("x"))
    assert err.value.code == FORBIDDEN
    with pytest.raises(SuaveplanError):
        guarded_replace(Forged("x"))
    with pytest.raises(TypeError):
        guarded_fields(object())


def test_the_dataclasses_facade_serves_the_guarded_readers() -> None:
    facade = module_facade("dataclasses")
    assert facade.fields is guarded_fields
    assert facade.replace is guarded_replace


def test_dataclasses_own_callers_use_the_guarded_readers_in_a_guarded_process() -> None:
    """`install_stdlib_guards` is process-wide and irreversible: checked in a child."""
    script = textwrap.dedent(
        """
        import dataclasses
        from suaveplan_sandbox.vm._guest._guards import install_stdlib_guards

        @dataclasses.dataclass
        class Named:
            format: str = ""

        @dataclasses.dataclass(init=False)
        class Text(str):
            pass

        forged = {"format": dataclasses.fields(Named)[0]}
        install_stdlib_guards()
        text = Text("{0.__globals__}")
        object.__setattr__(text, "__dataclass_fields__", forged)
        print(dataclasses.asdict(text), dataclasses.astuple(text), dataclasses.fields(text))
        print(dataclasses.replace(text) == text)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split("\n")[:2] == ["{} () ()", "True"]
