"""Findings of the escape-corpus review, each from the attacker's side and the author's side.

These run in a real worker: sealing of shared classes and the Protocol guard are applied
only in a hardened worker process (they are irreversible and process-wide).
"""

from __future__ import annotations

import dataclasses
import enum
import hmac
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox
from suaveplan_sandbox.vm._guest._seal import is_prepared, is_sealed
from suaveplan_sandbox.vm._hardening import hardening_was_applied

PLUGIN = """
import dataclasses
import enum
import json
import typing
from typing import ClassVar

from suaveplan import SuaveplanError, fs


@dataclasses.dataclass
class Point:
    x: "int"
    label: "str" = "p"
    scale: "typing.ClassVar[int]" = 10
    unit: "ClassVar[str]" = "cm"


@dataclasses.dataclass(frozen=True, slots=True)
class Frozen:
    a: "int"


class Colour(enum.Enum):
    RED = 1


class Mine:
    def __init__(self):
        self._secret = 41

    def _helper(self):
        return self._secret + 1


@typing.runtime_checkable
class HasArea(typing.Protocol):
    def area(self): ...


class Square:
    def area(self):
        return 4


def dataclass_with_string_annotations():
    p = Point(3)
    return [p.x, p.label, Point.scale + len(Point.unit), Frozen(2).a,
            [f.name for f in dataclasses.fields(Point)]]


def isinstance_of_type():
    return [isinstance(int, type), isinstance(3, type), issubclass(bool, type),
            isinstance(Mine, type), type(3) is int]


def type_of_a_class():
    return type(int)


def own_private_attributes():
    m = Mine()
    setattr(m, "_other", 1)
    return [getattr(m, "_secret"), getattr(m, "_helper")(), hasattr(m, "_other"),
            getattr(Mine, "_helper")(m)]


def foreign_private_attribute(which):
    target = {"facade": fs, "error": SuaveplanError("SAND_VM_PLUGIN_ERROR", "x")}[which]
    return getattr(target, "_sp_content" if which == "facade" else "_x", "absent")


def own_dunder():
    return getattr(Mine(), "__dict__")


def protocol_with_public_members():
    return [isinstance(Square(), HasArea), isinstance(3, HasArea)]


def protocol_declaring_a_dunder_by_hand():
    class Oracle(typing.Protocol):
        _is_runtime_protocol = True

        def __globals__(self): ...

    return isinstance(fs.read_text, Oracle)


def protocol_declaring_a_private_member_by_hand():
    class Oracle(typing.Protocol):
        _is_runtime_protocol = True

        def _sp_content(self): ...

    return issubclass(SuaveplanError, Oracle)


def runtime_checkable_with_a_dunder():
    @typing.runtime_checkable
    class Oracle(typing.Protocol):
        def __wrapped__(self): ...

    return 1


def patch_shared(which):
    target = {
        "Field": dataclasses.Field,
        "JSONEncoder": json.JSONEncoder,
        "Enum": enum.Enum,
        "SuaveplanError": SuaveplanError,
        "Protocol": typing.Protocol,
    }[which]
    target.forged = property(lambda self: "forged")
    return "patched"


def patch_own():
    class Local:
        pass

    Local.x = 5
    Colour.extra = 2
    Mine.added = 3
    return [Local.x, Colour.extra, Mine().added, json.dumps({"a": 1}), Colour.RED.value]
"""


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[VmSandbox]:
    (tmp_path / "plugin.py").write_text(PLUGIN)
    policy = PermissionPolicy.from_manifest({"name": "findings"}, root=tmp_path)
    sb = await create_vm_sandbox(plugin_module_path=tmp_path / "plugin.py", policy=policy)
    try:
        yield sb
    finally:
        await sb.dispose()


async def _code(sb: VmSandbox, name: str, *args: object) -> tuple[str, dict[str, object]]:
    with pytest.raises(SuaveplanError) as info:
        await sb.call(name, *args)
    return info.value.code, dict(info.value.details)


async def test_dataclass_with_string_annotations_works(sandbox: VmSandbox) -> None:
    assert await sandbox.call("dataclass_with_string_annotations") == [
        3,
        "p",
        12,
        2,
        ["x", "label"],
    ]


async def test_isinstance_of_type_works_and_type_of_a_class_stays_guarded(
    sandbox: VmSandbox,
) -> None:
    assert await sandbox.call("isinstance_of_type") == [True, False, False, True, True]
    code, _ = await _code(sandbox, "type_of_a_class")
    assert code == "SAND_VM_INDIRECT_EVAL_REJECTED"


async def test_getattr_serves_the_plugins_own_private_attributes(sandbox: VmSandbox) -> None:
    assert await sandbox.call("own_private_attributes") == [41, 42, True, 42]


@pytest.mark.parametrize("which", ["facade", "error"])
async def test_getattr_refuses_private_attributes_of_foreign_objects(
    sandbox: VmSandbox, which: str
) -> None:
    code, _ = await _code(sandbox, "foreign_private_attribute", which)
    assert code == "SAND_VM_ATTRIBUTE_FORBIDDEN"


async def test_getattr_refuses_dunders_even_on_the_plugins_own_objects(
    sandbox: VmSandbox,
) -> None:
    code, _ = await _code(sandbox, "own_dunder")
    assert code == "SAND_VM_ATTRIBUTE_FORBIDDEN"


async def test_runtime_checkable_protocols_with_public_members_work(sandbox: VmSandbox) -> None:
    assert await sandbox.call("protocol_with_public_members") == [True, False]


@pytest.mark.parametrize(
    "name",
    [
        "protocol_declaring_a_dunder_by_hand",
        "protocol_declaring_a_private_member_by_hand",
        "runtime_checkable_with_a_dunder",
    ],
)
async def test_a_protocol_cannot_be_an_attribute_existence_oracle(
    sandbox: VmSandbox, name: str
) -> None:
    code, _ = await _code(sandbox, name)
    assert code == "SAND_VM_ATTRIBUTE_FORBIDDEN"


@pytest.mark.parametrize("which", ["Field", "JSONEncoder", "Enum", "SuaveplanError", "Protocol"])
async def test_classes_shared_with_the_worker_cannot_be_patched(
    sandbox: VmSandbox, which: str
) -> None:
    code, details = await _code(sandbox, "patch_shared", which)
    assert code == "SAND_VM_PLUGIN_ERROR"
    assert details["type"] == "TypeError"
    assert "immutable" in str(details["message"])


async def test_the_plugins_own_classes_stay_mutable(sandbox: VmSandbox) -> None:
    assert await sandbox.call("patch_own") == [5, 2, 3, '{"a": 1}', 1]


ALL_MODULES_PLUGIN = """
import base64, binascii, cmath, collections, csv, dataclasses, datetime, decimal, enum
import fractions, functools, hashlib, hmac, itertools, json, math, random, re, statistics
import textwrap, typing, uuid
import urllib.parse
from io import BytesIO, StringIO


def use():
    return [
        statistics.mean([1, 2, 3]),
        str(fractions.Fraction(1, 3)),
        abs(cmath.sqrt(-4)),
        len(str(uuid.uuid4())),
        hmac.new(b"k", b"m", "sha256").hexdigest()[:8],
        urllib.parse.quote("a b"),
        next(csv.reader(StringIO("x,y"))),
        textwrap.shorten("a b c d", 5),
    ]
"""


async def test_every_allowlisted_module_imports_and_works_in_a_real_worker(
    tmp_path: Path,
) -> None:
    # A worker under Landlock cannot open module files: the fork server preloads them all.
    (tmp_path / "plugin.py").write_text(ALL_MODULES_PLUGIN)
    policy = PermissionPolicy.from_manifest({"name": "mods"}, root=tmp_path)
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "plugin.py", policy=policy
    ) as sb:
        assert await sb.call("use") == [
            2,
            "1/3",
            2.0,
            36,
            hmac.new(b"k", b"m", "sha256").hexdigest()[:8],
            "a%20b",
            ["x", "y"],
            "[...]",
        ]


def test_sealing_never_happens_in_the_host_process() -> None:
    # The sandboxes above ran in workers; this process (the host) must be untouched.
    assert not hardening_was_applied()
    assert not is_prepared()
    for cls in (json.JSONEncoder, dataclasses.Field, enum.Enum, SuaveplanError):
        assert not is_sealed(cls), cls
