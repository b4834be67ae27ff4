"""Eighth red-team pass on the in-interpreter layer, module by module through the facades:
trusted code that copied a foreign class's dict into the plugin's own function
(`functools.wraps`), a facade function handing out the real `getattr`
(`enum.pickle_by_enum_name`), and two ways of giving an object an instance
`__dataclass_fields__` (UserDict's `__copy__` with `__class__`/`__dict__` answered by the
plugin, and `dataclasses.dataclass` applied to an instance).

Each refused route was a working escape before its fix (the escape corpus carries the full
attacks: `introspect_wraps_class_dict_private`, `introspect_enum_pickle_by_enum_name_getattr`,
`format_user_dict_copy_dataclass_fields`, `format_dataclass_of_an_instance`); here each is
asserted to fail closed, and the ordinary code next to it to keep working. They run in real
workers: the stdlib guards exist only in a prepared worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _redteam_support import create_plugin, outcome

from suaveplan_sandbox.vm import VmSandbox
from suaveplan_sandbox.vm._guest._policy import ALLOWED_MODULES
from suaveplan_sandbox.vm._guest._runtime import module_facade

FORBIDDEN = "SAND_VM_ATTRIBUTE_FORBIDDEN"

ROUTES = """
import collections
import dataclasses
import enum
import functools
import typing

U = "_" * 2


def holder():
    pass


def wraps_copies_no_foreign_private_member():
    forward_ref = type(typing.get_args(typing.List["int"])[0])
    functools.wraps(forward_ref)(holder)
    return hasattr(holder, "_evaluate")


def mine():
    pass


mine._tag = "own"
mine.label = "public"


def wraps_copies_the_plugins_own_attributes():
    def inner():
        pass

    functools.wraps(mine)(inner)
    return [inner._tag, inner.label]


def pickle_by_enum_name_in_the_facade():
    return hasattr(enum, "pickle_by_enum_name")


class Maker:
    def __new__(cls, *args):
        return premade[0]


class Plain:
    pass


premade = [Plain()]
forged = dataclasses.field()
forged.name = "format"


class Source(collections.UserDict):
    @property
    def __class__(self):
        return Maker

    @property
    def __dict__(self):
        return {"data": {}, U + "dataclass_fields" + U: {"format": forged}}


def user_dict_copy_with_a_dunder_key():
    Source().copy()
    return "copied"


class ListSource(collections.UserList):
    @property
    def __class__(self):
        return Maker

    @property
    def __dict__(self):
        return {"data": [], U + "dataclass_fields" + U: {"format": forged}}


def user_list_copy_with_a_dunder_key():
    # `UserList.copy` calls the class; `UserDict.copy` runs `copy.copy`, i.e. `__copy__`.
    collections.UserDict.copy(ListSource())
    return "copied"


class Fake(str):
    def __call__(self):
        pass


def dataclass_of_an_instance():
    dataclasses.dataclass(Fake("x"))
    return "decorated"


class Bag(collections.UserDict):
    def mark(self):
        self._note = "kept"
        self.extra = 1
        return self


class Row(collections.UserList):
    pass


@dataclasses.dataclass
class Point:
    x: int


def legit():
    bag = Bag({"a": 1}).mark()
    copy = bag.copy()
    row = Row([1, 2]).copy()
    plain = collections.UserDict({"b": 2}).copy()
    return [
        dict(copy),
        copy._note,
        copy.extra,
        list(row),
        dict(plain),
        dataclasses.replace(Point(1), x=2).x,
        dataclasses.dataclass(eq=False)(Plain) is Plain,
    ]
"""


async def _create(tmp_path: Path, source: str) -> VmSandbox:
    return await create_plugin(tmp_path, source, name="redteam8")


async def test_wraps_never_copies_a_foreign_classs_private_members(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await sb.call("wraps_copies_no_foreign_private_member") is False
        assert await sb.call("wraps_copies_the_plugins_own_attributes") == ["own", "public"]


@pytest.mark.parametrize("name", sorted(ALLOWED_MODULES - {"suaveplan"}))
def test_no_facade_offers_a_pickling_hook_returning_the_real_getattr(name: str) -> None:
    assert getattr(module_facade(name), "pickle_by_enum_name", None) is None


async def test_the_enum_facade_has_no_pickle_by_enum_name(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await sb.call("pickle_by_enum_name_in_the_facade") is False


@pytest.mark.parametrize(
    "name", ["user_dict_copy_with_a_dunder_key", "user_list_copy_with_a_dunder_key"]
)
async def test_user_dict_and_list_copies_never_write_a_dunder_key(
    tmp_path: Path, name: str
) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await outcome(sb, name) == FORBIDDEN


async def test_dataclass_applies_to_classes_only(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await outcome(sb, "dataclass_of_an_instance") == FORBIDDEN


async def test_copies_and_dataclasses_keep_working(tmp_path: Path) -> None:
    async with await _create(tmp_path, ROUTES) as sb:
        assert await sb.call("legit") == [{"a": 1}, "kept", 1, [1, 2], {"b": 2}, 2, True]
