"""GuestRuntime in-process against a fake host_call."""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._guest import GuestRuntime, PluginBundle, compile_bundle, load_plugin

Calls = list[tuple[str, str, dict[str, object]]]


def _runtime(tmp_path: Path, source: str, calls: Calls | None = None) -> GuestRuntime:
    file = tmp_path / "plugin.py"
    file.write_text(source)
    bundle = PluginBundle.from_wire(load_plugin(file).to_wire())
    seen = calls if calls is not None else []

    def host_call(cap: str, op: str, args: dict[str, object]) -> object:
        seen.append((cap, op, args))
        if args.get("path") == "denied":
            raise SuaveplanError("SAND_PERM_DENIED", "denied", {"capability": cap, "reason": "r"})
        return b"data"

    rt = GuestRuntime(compile_bundle(bundle), host_call=host_call, log=lambda lv, t: None)
    rt.start()
    return rt


def _code(rt: GuestRuntime, name: str) -> str:
    with pytest.raises(SuaveplanError) as info:
        rt.call(name, [], {})
    return info.value.code


@pytest.mark.parametrize(
    "name", ["os", "sys", "open", "subprocess", "socket", "ctypes", "importlib", "builtins"]
)
def test_unavailable_names_surface_as_name_unavailable(tmp_path: Path, name: str) -> None:
    rt = _runtime(tmp_path, f"def f():\n    return {name}\n")
    assert _code(rt, "f") == "SAND_VM_NAME_UNAVAILABLE"


def test_direct_eval_exec_compile_are_rejected_at_call(tmp_path: Path) -> None:
    rt = _runtime(
        tmp_path, "def a(): eval('1')\ndef b(): exec('1')\ndef c(): compile('1','x','eval')\n"
    )
    assert {_code(rt, n) for n in "abc"} == {"SAND_VM_EVAL_REJECTED"}


def test_indirect_eval_routes_are_rejected(tmp_path: Path) -> None:
    src = "def a():\n    e = eval\n    e('1')\ndef b(): getattr(1, 'real'); (0, exec)[1]('1')\n"
    src += "def c(): type(lambda: 0)\n"
    rt = _runtime(tmp_path, src)
    assert {_code(rt, n) for n in "abc"} == {"SAND_VM_INDIRECT_EVAL_REJECTED"}


def test_facades_are_frozen(tmp_path: Path) -> None:
    rt = _runtime(
        tmp_path,
        "import json\nfrom suaveplan import fs\n"
        "def a(): json.dumps = 1\ndef b(): fs.read_bytes = 1\n"
        "def c(): return hasattr(json, 'dumps')\n",
    )
    assert _code(rt, "a") == _code(rt, "b") == "SAND_VM_GLOBALS_FROZEN"
    assert rt.call("c", [], {}) is True


def test_typing_sys_is_not_exposed(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, "import typing\ndef f(): return hasattr(typing, 'sys')\n")
    assert rt.call("f", [], {}) is False


@pytest.mark.parametrize(
    "src",
    ["import os\n", "import subprocess\n", "from io import open\n", "import other_plugin\n"],
)
def test_forbidden_imports_fail_at_load(tmp_path: Path, src: str) -> None:
    (tmp_path / "p.py").write_text(src)
    with pytest.raises(SuaveplanError) as info:
        load_plugin(tmp_path / "p.py")
    assert info.value.code == "SAND_VM_MODULE_IMPORT_FORBIDDEN"


@pytest.mark.parametrize(
    "expr",
    [
        "x.__class__",
        "x.gi_frame",
        "x.f_back",
        "x.tb_frame",
        "x.cr_frame",
        "x.f_globals",
        "x.co_code",
        "x._\uff3fclass__",
        "'{0.__class__}'.format(x)",
    ],
)
def test_dunder_and_frame_attributes_are_rejected_at_load(tmp_path: Path, expr: str) -> None:
    (tmp_path / "p.py").write_text(f"def f(x):\n    return {expr}\n")
    with pytest.raises(SuaveplanError) as info:
        load_plugin(tmp_path / "p.py")
    assert info.value.code == "SAND_VM_ATTRIBUTE_FORBIDDEN"


@pytest.mark.parametrize(
    "src",
    [
        "class A(metaclass=type): pass\n",
        "async def f(): pass\n",
        "try:\n    pass\nexcept* ValueError:\n    pass\n",
    ],
)
def test_forbidden_syntax_is_rejected_at_load(tmp_path: Path, src: str) -> None:
    (tmp_path / "p.py").write_text(src)
    with pytest.raises(SuaveplanError) as info:
        load_plugin(tmp_path / "p.py")
    assert info.value.code == "SAND_VM_SYNTAX_FORBIDDEN"


def test_runtime_getattr_and_format_with_built_names_are_rejected(tmp_path: Path) -> None:
    rt = _runtime(
        tmp_path,
        "def a(): return getattr(1, '_' + '_class__')\n"
        "def b(): return ('{0._' + '_class__}').format(1)\n",
    )
    assert _code(rt, "a") == _code(rt, "b") == "SAND_VM_ATTRIBUTE_FORBIDDEN"


def test_plugin_exception_becomes_plugin_error_with_type(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, "def f(): raise ValueError('bad')\n")
    with pytest.raises(SuaveplanError) as info:
        rt.call("f", [], {})
    assert info.value.code == "SAND_VM_PLUGIN_ERROR"
    assert info.value.details == {"type": "ValueError", "message": "bad"}


def test_unencodable_result_is_result_invalid(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, "def f(): return object()\n")
    assert _code(rt, "f") == "SAND_VM_RESULT_INVALID"


def test_private_or_missing_functions_are_no_such_function(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, "def _f(): return 1\nimport json\n")
    assert _code(rt, "_f") == _code(rt, "json") == _code(rt, "g") == "SAND_VM_NO_SUCH_FUNCTION"


def test_permission_denied_is_catchable_and_fs_sends_documented_shape(tmp_path: Path) -> None:
    calls: Calls = []
    rt = _runtime(
        tmp_path,
        "from suaveplan import fs, SuaveplanError\n"
        "def f(p):\n    try:\n        return fs.read_bytes(p)\n"
        "    except SuaveplanError as e:\n        return e.code\n",
        calls,
    )
    assert rt.call("f", ["a.txt"], {}) == b"data"
    assert rt.call("f", ["denied"], {}) == "SAND_PERM_DENIED"
    assert calls[0] == ("fs", "read_bytes", {"path": "a.txt"})


def test_relative_import_works_in_a_package_plugin(tmp_path: Path) -> None:
    pkg = tmp_path / "plug"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import helper\ndef f(): return helper.g()\n")
    (pkg / "helper.py").write_text("def g(): return 7\n")
    rt = GuestRuntime(
        compile_bundle(load_plugin(pkg)), host_call=lambda c, o, a: None, log=lambda lv, t: None
    )
    rt.start()
    assert rt.call("f", [], {}) == 7
