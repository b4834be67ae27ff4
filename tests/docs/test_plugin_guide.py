"""docs/plugin-authors.md matches the running VM: its example plugins run as described, and the
builtins and modules it lists as available (or not) are exactly that in a real worker."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from suaveplan_sandbox.adapters import Adapters, BeneathRootFs, SqliteDb, apply_migrations
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import InMemoryEvents
from suaveplan_sandbox.vm import create_vm_sandbox

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "plugin-authors.md").read_text(encoding="utf-8")
INVOICES = ROOT / "examples" / "invoices"

_PY_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_.]*)(?:\(\))?`")


def python_blocks() -> list[str]:
    return _PY_BLOCK.findall(GUIDE)


def _bullet(section: str, lead: str) -> str:
    """The text of the bullet starting with `lead` under the `## section` heading."""
    body = GUIDE.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    start = body.index(f"- {lead}")
    end = body.find("\n- ", start + 2)
    return body[start : end if end != -1 else None]


def _names(text: str) -> list[str]:
    return _NAME.findall(text)


DOCUMENTED_BUILTINS = [
    n for n in _names(_bullet("What is available", "**Builtins**")) if n not in ("type",)
]
_MODULES_BULLET = _bullet("What is available", "**Modules**")
_MODULES_LIST, _REMOVED = _MODULES_BULLET.split("A few names", 1)
# `io` (only `StringIO` and `BytesIO`): the parenthesis names members, not modules
DOCUMENTED_MODULES = _names(re.sub(r"\([^)]*\)", "", _MODULES_LIST))
REMOVED_NAMES = _names(_REMOVED)
ABSENT_BUILTINS = _names(_bullet("What is not available", "**Builtins**").split(";")[0])
ABSENT_MODULES = _names(_bullet("What is not available", "**Modules**").split("→")[0])


async def _sandbox_result(
    tmp_path: Path, source: str, call: str, *args: Any, manifest: dict[str, Any] | None = None
) -> Any:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(source)
    policy = PermissionPolicy.from_manifest(
        manifest or {"name": "guide", "kind": "python"}, root=tmp_path
    )
    async with await create_vm_sandbox(plugin_module_path=plugin, policy=policy) as sb:
        return await sb.call(call, *args)


def test_the_lists_were_found_in_the_guide() -> None:
    assert {"abs", "sorted", "memoryview", "print", "getattr"} <= set(DOCUMENTED_BUILTINS)
    assert {"json", "re", "csv", "io", "urllib.parse", "suaveplan"} <= set(DOCUMENTED_MODULES)
    assert {"open", "input", "globals", "dir", "exit"} <= set(ABSENT_BUILTINS)
    assert {"os", "sys", "subprocess", "pickle", "os.path"} <= set(ABSENT_MODULES)
    assert {"typing.get_type_hints", "uuid.uuid1"} <= set(REMOVED_NAMES)
    assert not {"StringIO", "BytesIO"} & set(DOCUMENTED_MODULES)


async def test_names_documented_as_removed_from_facades_are_absent(tmp_path: Path) -> None:
    modules = sorted({n.rsplit(".", 1)[0] for n in REMOVED_NAMES})
    checks = ", ".join(
        f"hasattr({n.rsplit('.', 1)[0]}, {n.rsplit('.', 1)[1]!r})" for n in REMOVED_NAMES
    )
    source = (
        "".join(f"import {m}\n" for m in modules) + f"\n\ndef probe():\n    return [{checks}]\n"
    )
    assert await _sandbox_result(tmp_path, source, "probe") == [False] * len(REMOVED_NAMES)


async def test_io_offers_only_stringio_and_bytesio(tmp_path: Path) -> None:
    source = (
        "import io\n\n\ndef probe():\n"
        "    return [hasattr(io, 'StringIO'), hasattr(io, 'BytesIO'), hasattr(io, 'open'),"
        " hasattr(io, 'FileIO')]\n"
    )
    assert await _sandbox_result(tmp_path, source, "probe") == [True, True, False, False]


async def test_every_documented_builtin_is_there(tmp_path: Path) -> None:
    source = "def names():\n    return len([" + ", ".join(DOCUMENTED_BUILTINS) + "])\n"
    assert await _sandbox_result(tmp_path, source, "names") == len(DOCUMENTED_BUILTINS)
    one_arg_type = "def t():\n    return type(1) is int\n"
    assert await _sandbox_result(tmp_path, one_arg_type, "t") is True


@pytest.mark.parametrize("name", ABSENT_BUILTINS)
async def test_every_builtin_documented_absent_is_unavailable(tmp_path: Path, name: str) -> None:
    with pytest.raises(SuaveplanError) as info:
        await _sandbox_result(tmp_path, f"def use():\n    return {name}\n", "use")
    assert info.value.code == "SAND_VM_NAME_UNAVAILABLE"
    assert info.value.details["name"] == name


async def test_import_is_a_dunder_name_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(SuaveplanError) as info:
        await _sandbox_result(tmp_path, "def use():\n    return __import__('os')\n", "use")
    assert info.value.code == "SAND_VM_ATTRIBUTE_FORBIDDEN"
    assert info.value.details["line"] == 2


@pytest.mark.parametrize("module", DOCUMENTED_MODULES)
async def test_every_documented_module_imports_in_a_real_worker(
    tmp_path: Path, module: str
) -> None:
    source = f"import {module}\n\n\ndef ok():\n    return True\n"
    assert await _sandbox_result(tmp_path, source, "ok") is True


@pytest.mark.parametrize("module", ABSENT_MODULES)
async def test_every_module_documented_absent_is_refused_at_creation(
    tmp_path: Path, module: str
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await _sandbox_result(tmp_path, f"import {module}\n\n\ndef ok():\n    return 1\n", "ok")
    assert info.value.code == "SAND_VM_MODULE_IMPORT_FORBIDDEN"
    assert info.value.details["module"] == module
    assert info.value.details["line"] == 1


async def test_the_complete_plugin_runs_as_shown(tmp_path: Path) -> None:
    root = tmp_path / "invoices"
    shutil.copytree(INVOICES, root)
    (root / "reports").mkdir(exist_ok=True)
    (root / "plugin.py").write_text(python_blocks()[0])
    policy = PermissionPolicy.from_manifest(root / "manifest.toml", root=root)
    db = SqliteDb(tmp_path / "p.db", plugin_prefix="billing_")
    await apply_migrations(db, root / "migrations", plugin=policy.plugin)
    events = InMemoryEvents()
    fs = BeneathRootFs(root)
    try:
        async with await create_vm_sandbox(
            plugin_module_path=root / "plugin.py",
            policy=policy,
            proxies=Adapters(fs=fs, db=db, events=events),
        ) as sb:
            totals = await sb.call("summarize", "march")
    finally:
        fs.close()
    assert isinstance(totals, dict) and totals
    assert all(isinstance(v, float) for v in totals.values())
    assert (root / "reports" / "march.txt").read_text() == repr(totals)
    assert events.published == [
        ("invoice-summary", "invoice.summarised", {"month": "march", "customers": len(totals)})
    ]


async def test_the_error_handling_example_behaves_as_described(tmp_path: Path) -> None:
    block = next(b for b in python_blocks() if "def load_config" in b)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "settings.json").write_text('{"a": 1}')
    denied = {"name": "guide", "kind": "python", "permissions": {"fs": ["./uploads/*"]}}
    assert await _sandbox_result(tmp_path, block, "load_config", manifest=denied) == "{}"
    allowed = {"name": "guide", "kind": "python", "permissions": {"fs": ["./config/*"]}}
    assert await _sandbox_result(tmp_path, block, "load_config", manifest=allowed) == '{"a": 1}'


@pytest.mark.parametrize(
    ("source", "call", "code", "details"),
    [
        ("def f():\n    return {}['x']\n", "f", "SAND_VM_PLUGIN_ERROR", {"type": "KeyError"}),
        ("def f():\n    return {1}\n", "f", "SAND_VM_RESULT_INVALID", {}),
        ("def f():\n    return 1\n", "g", "SAND_VM_NO_SUCH_FUNCTION", {}),
        ("def _f():\n    return 1\n", "_f", "SAND_VM_NO_SUCH_FUNCTION", {}),
        (
            "from suaveplan import SuaveplanError\n\ndef f():\n"
            "    raise SuaveplanError('BUDGET_EXCEEDED', 'forged', {})\n",
            "f",
            "SAND_VM_PLUGIN_ERROR",
            {"claimed_code": "BUDGET_EXCEEDED"},
        ),
    ],
)
async def test_what_the_host_sees_when_a_function_fails(
    tmp_path: Path, source: str, call: str, code: str, details: dict[str, str]
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await _sandbox_result(tmp_path, source, call)
    assert info.value.code == code
    assert details.items() <= info.value.details.items()


def _api_names() -> list[str]:
    """Every `module.function(` the runtime-API section documents (`fs.read_text(...)`, ...)."""
    body = GUIDE.split("## The `suaveplan` runtime API\n", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"`@?((?:fs|db|secrets|events|log)\.[a-z_]+)\(", body)
    # `log.debug / log.info / log.warning / log.error(msg, *args)` names four at once
    for spelled in re.findall(r"`((?:log\.[a-z]+ / )+log\.[a-z]+)\(", body):
        found.extend(name.strip() for name in spelled.split("/"))
    return sorted(set(found))


API_NAMES = _api_names()


def test_the_runtime_api_section_was_parsed() -> None:
    assert {"fs.read_text", "fs.list_dir", "db.query", "secrets.get", "events.subscribe"} <= set(
        API_NAMES
    )
    assert {"log.debug", "log.error"} <= set(API_NAMES)


async def test_every_documented_runtime_function_exists(tmp_path: Path) -> None:
    checks = ", ".join(f"hasattr({n.split('.')[0]}, {n.split('.')[1]!r})" for n in API_NAMES)
    source = (
        "from suaveplan import db, events, fetch, fs, log, secrets, SuaveplanError\n\n\n"
        f"def probe():\n    return [callable(fetch), {checks}]\n"
    )
    assert await _sandbox_result(tmp_path, source, "probe") == [True] * (len(API_NAMES) + 1)
