"""Sixth red-team pass on the in-interpreter layer: routes through trusted standard-library
code (copy's memo, inspect's signature text, format fields) and a facade name.

Each refused route was a working escape before its fix (the escape corpus carries the full
attacks: `dyncode_deepcopy_memo_forwardref_code`, `dyncode_dataclass_signature_text_eval`,
`format_attribute_error_obj_field`); here each is asserted to fail closed, and the ordinary
code next to it to keep working. They run in real workers: the stdlib guards exist only in
a prepared worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _redteam_support import create_plugin, outcome

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm import VmSandbox
from suaveplan_sandbox.vm._guest import load_plugin

FORBIDDEN = "SAND_VM_ATTRIBUTE_FORBIDDEN"

ROUTES = """
import dataclasses
import functools
import typing

U = "_" * 2
seen = []


class Hook:
    def __deepcopy__(self, memo):
        seen.append(len(memo))
        for value in list(memo.values()):
            if isinstance(value, dict):
                seen.extend(k for k in value if isinstance(k, str) and k.startswith(U))
        return self


class Answering:
    def __getattr__(self, name):
        if name == U + "deepcopy" + U:
            return lambda memo: seen.append(len(memo)) or self
        raise AttributeError(name)


@dataclasses.dataclass
class Box:
    v: object


def forward_ref_slots_through_the_memo():
    seen.clear()
    forward_ref = type(typing.get_args(typing.List["int"])[0])
    try:
        dataclasses.asdict(Box(forward_ref("1 + 1", module=Hook())))
    except Exception as exc:
        seen.append(repr(exc)[:60])
    return seen


def a_getattr_answered_hook_gets_no_memo():
    seen.clear()
    dataclasses.asdict(Box([{"a": 1}, Answering()]))
    return seen


TEXT = "(a=sys.nope)"


class Descriptor:
    def __get__(self, instance, owner=None):
        return self

    def __call__(self, *args):
        return None

    def __getattr__(self, name):
        if name == U + "text_signature" + U:
            return TEXT
        raise AttributeError(name)


def signature_text_of_a_wrapped_init():
    class C:
        @functools.wraps(Descriptor())
        def __init__(self):
            pass

    return repr(dataclasses.dataclass(init=False)(C))[-3:]


def signature_text_from_a_signature_method():
    class C:
        def __signature__():
            return TEXT

    return repr(dataclasses.dataclass(C))[-3:]


def obj_in_a_format_field():
    try:
        typing.Type.nope
    except AttributeError as exc:
        return ("{0." + "obj" + "}").format(exc)


def obj_in_a_nested_format_spec():
    try:
        typing.Type.nope
    except AttributeError as exc:
        return ("{0:{1." + "obj" + "}}").format(1, exc)


def function_type_in_the_dataclasses_facade():
    return hasattr(dataclasses, "FunctionType")


class Copied:
    def __init__(self, items):
        self.items = items

    def __deepcopy__(self, memo):
        return Copied(list(self.items) + ["copied"])


@dataclasses.dataclass
class Point:
    x: int
    tags: list = dataclasses.field(default_factory=list)


class Own:
    def __init__(self):
        self.x = 1


def legit():
    box = dataclasses.asdict(Box([Copied([1]), {"k": Point(1, [2])}, (3, Own())]))
    inner = box["v"]
    return [
        inner[0].items,
        inner[1],
        inner[2][0],
        inner[2][1].x,
        dataclasses.astuple(Point(2)),
        repr(Point(3)),
        "{0.x}".format(Own()),
        "{0.x} {1}".format(Point(4), "y"),
    ]
"""


async def _create(tmp_path: Path, source: str) -> VmSandbox:
    return await create_plugin(tmp_path, source, name="redteam6")


async def test_a_plugin_deepcopy_hook_never_sees_the_copys_memo(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        got = await sb.call("forward_ref_slots_through_the_memo")
        assert isinstance(got, list)
        # The hook ran with an empty memo of its own, and the ForwardRef's dunder slots
        # were refused when the copy set them.
        assert got[0] == 0
        assert not any(str(x).startswith("__forward") for x in got)
        assert FORBIDDEN in got[-1]
        assert await sb.call("a_getattr_answered_hook_gets_no_memo") == [0]


@pytest.mark.parametrize(
    "name", ["signature_text_of_a_wrapped_init", "signature_text_from_a_signature_method"]
)
async def test_dataclasses_never_evaluates_a_plugins_signature_text(
    tmp_path: Path, name: str
) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await sb.call(name) == "C'>"


@pytest.mark.parametrize("name", ["obj_in_a_format_field", "obj_in_a_nested_format_spec"])
async def test_a_format_field_may_not_name_obj(tmp_path: Path, name: str) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await outcome(sb, name) == FORBIDDEN


async def test_facades_hold_no_type_that_type_refuses(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await sb.call("function_type_in_the_dataclasses_facade") is False


async def test_copies_dataclasses_and_format_fields_keep_working(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await sb.call("legit") == [
            [1, "copied"],
            {"k": {"x": 1, "tags": [2]}},
            3,
            1,
            [2, []],
            "Point(x=3, tags=[])",
            "1",
            "4 y",
        ]


def test_a_constant_format_field_naming_obj_is_refused_at_load(tmp_path: Path) -> None:
    (tmp_path / "plugin.py").write_text('def f(e):\n    return "{0.obj}".format(e)\n')
    with pytest.raises(SuaveplanError) as info:
        load_plugin(tmp_path / "plugin.py")
    assert info.value.code == FORBIDDEN
