"""More guest behaviour: NFKC names, match patterns, isolation, proxies and events."""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._guest import GuestRuntime, compile_bundle, load_plugin


def _runtime(
    tmp_path: Path, source: str, reply: object = None
) -> tuple[GuestRuntime, list[tuple[str, str, dict[str, object]]], list[tuple[str, str]]]:
    file = tmp_path / "plugin.py"
    file.write_text(source)
    calls: list[tuple[str, str, dict[str, object]]] = []
    logs: list[tuple[str, str]] = []

    def host_call(cap: str, op: str, args: dict[str, object]) -> object:
        calls.append((cap, op, args))
        return reply

    rt = GuestRuntime(
        compile_bundle(load_plugin(file)),
        host_call=host_call,
        log=lambda lv, t: logs.append((lv, t)),
    )
    rt.start()
    return rt, calls, logs


def test_fullwidth_eval_is_still_direct_eval(tmp_path: Path) -> None:
    rt, _, _ = _runtime(tmp_path, "def f():\n    return \uff45val('1')\n")
    with pytest.raises(SuaveplanError) as info:
        rt.call("f", [], {})
    assert info.value.code == "SAND_VM_EVAL_REJECTED"


def test_match_class_pattern_naming_a_dunder_is_rejected_at_load(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text(
        "def f(x):\n    match x:\n        case int(__class__=c):\n            return c\n"
    )
    with pytest.raises(SuaveplanError) as info:
        load_plugin(tmp_path / "p.py")
    assert info.value.code == "SAND_VM_ATTRIBUTE_FORBIDDEN"


def test_module_globals_do_not_leak_between_calls_into_builtins(tmp_path: Path) -> None:
    rt, _, _ = _runtime(
        tmp_path, "import json\ndef a():\n    global len\n    len = 5\ndef b(): return len([1])\n"
    )
    rt.call("a", [], {})
    with pytest.raises(SuaveplanError):
        rt.call("b", [], {})  # the plugin rebound its own global, not the shared builtin
    fresh_dir = tmp_path / "other"
    fresh_dir.mkdir()
    other, _, _ = _runtime(fresh_dir, "def b(): return len([1])\n")
    assert other.call("b", [], {}) == 1


def test_print_and_log_are_routed_to_the_log_callback(tmp_path: Path) -> None:
    rt, _, logs = _runtime(
        tmp_path, "from suaveplan import log\ndef f():\n    print('a', 1)\n    log.warning('w')\n"
    )
    rt.call("f", [], {})
    assert logs == [("info", "a 1"), ("warning", "w")]


def test_fetch_sends_documented_shape_and_returns_response(tmp_path: Path) -> None:
    reply = {"status": 200, "headers": [["Content-Type", "application/json"]], "body": b'{"a": 1}'}
    rt, calls, _ = _runtime(
        tmp_path,
        "from suaveplan import fetch\ndef f():\n    r = fetch('https://x.test/', headers={'A': 'b'})\n"
        "    return [r.status, r.headers['content-type'], r.json()]\n",
        reply,
    )
    assert rt.call("f", [], {}) == [200, "application/json", {"a": 1}]
    assert calls == [
        (
            "fetch",
            "request",
            {"url": "https://x.test/", "method": "GET", "headers": [["A", "b"]], "body": b""},
        )
    ]


def test_events_subscribe_registers_and_deliver_runs_handlers(tmp_path: Path) -> None:
    rt, _, logs = _runtime(
        tmp_path,
        "from suaveplan import events\n@events.subscribe('orders.*')\ndef on(p):\n    print(p)\n",
    )
    assert rt.subscriptions() == ["orders.*"]
    rt.deliver("orders.*", {"id": 1})
    assert logs == [("info", "{'id': 1}")]


def test_generator_frame_is_rejected_at_load(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text("def f():\n    g = (i for i in [1])\n    return g.gi_frame\n")
    with pytest.raises(SuaveplanError) as info:
        load_plugin(tmp_path / "p.py")
    assert info.value.code == "SAND_VM_ATTRIBUTE_FORBIDDEN"
