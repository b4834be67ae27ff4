"""functools.update_wrapper/wraps must not act as a generic getattr for guest code."""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._guest import GuestRuntime, compile_bundle, load_plugin
from suaveplan_sandbox.vm._guest import _runtime as _rt_module

_ORIGINAL_CHECK = _rt_module._check_name

SINK = (
    "import functools\n"
    "from suaveplan import fs\n"
    "store = {}\n"
    "class Sink:\n"
    "    def __setattr__(self, name, value):\n"
    "        store[name] = value\n"
)


def _runtime(tmp_path: Path, source: str) -> GuestRuntime:
    file = tmp_path / "plugin.py"
    file.write_text(source)
    rt = GuestRuntime(
        compile_bundle(load_plugin(file)),
        host_call=lambda cap, op, args: None,
        log=lambda lv, t: None,
    )
    rt.start()
    return rt


@pytest.mark.parametrize(
    "call",
    [
        "functools.update_wrapper(Sink(), fs.read_text, assigned=('_' + '_globals__',), updated=())",
        "functools.update_wrapper(Sink(), fs.read_text)",
        "functools.wraps(fs.read_text, assigned=('_' + '_globals__',), updated=())(Sink())",
        "functools.wraps(fs.read_text)(Sink())",
        "functools.update_wrapper(lambda: 0, fs.read_text, ('_' + '_globals__',))",
    ],
)
def test_update_wrapper_with_custom_names_or_sink_is_rejected(tmp_path: Path, call: str) -> None:
    rt = _runtime(tmp_path, SINK + f"def f():\n    {call}\n    return sorted(store)\n")
    with pytest.raises(SuaveplanError) as info:
        rt.call("f", [], {})
    assert info.value.code == "SAND_VM_ATTRIBUTE_FORBIDDEN"


def test_plain_wraps_decorator_still_works(tmp_path: Path) -> None:
    rt = _runtime(
        tmp_path,
        "import functools\n"
        "def deco(g):\n"
        "    @functools.wraps(g)\n"
        "    def inner(*a):\n"
        "        return g(*a)\n"
        "    return inner\n"
        "@deco\n"
        "def double(x):\n"
        "    return 2 * x\n"
        "def f():\n"
        "    return [double(21), functools.update_wrapper(lambda: 1, double)()]\n",
    )
    assert rt.call("f", [], {}) == [42, 1]


def test_enum_global_enum_cannot_overwrite_a_host_module(tmp_path: Path) -> None:
    rt = _runtime(
        tmp_path,
        "import enum\n"
        "class P(str):\n"
        "    def __call__(self, name):\n"
        "        return name\n"
        "def f():\n"
        "    x = enum.Enum('X', {'_check_name': 'a'},"
        " module='suaveplan_sandbox.vm._guest._runtime', type=P)\n"
        "    enum.global_enum(x)\n"
        "    return repr(getattr((), '_' + '_class__'))\n",
    )
    with pytest.raises(SuaveplanError) as info:
        rt.call("f", [], {})
    assert info.value.code in {"SAND_VM_PLUGIN_ERROR", "SAND_VM_ATTRIBUTE_FORBIDDEN"}
    assert _rt_module._check_name is _ORIGINAL_CHECK


def test_malformed_runtime_template_is_not_resolved_past_the_guard(tmp_path: Path) -> None:
    rt = _runtime(
        tmp_path,
        "class P:\n"
        "    pass\n"
        "def f():\n"
        "    u = '_' * 2\n"
        "    tpl = '{0.' + u + 'init' + u + '.' + u + 'globals' + u + '[nokey]}{'\n"
        "    try:\n"
        "        tpl.format(P())\n"
        "    except KeyError:\n"
        "        return 'resolved'\n"
        "    except ValueError:\n"
        "        return 'rejected'\n",
    )
    assert rt.call("f", [], {}) == "rejected"
