"""Plugin source is parsed, checked and compiled only in a short-lived child of the fork
server with capped memory and CPU: a plugin whose source costs gigabytes to parse gets a coded
error at create while the host and the fork server stay small and carry on, the checker's
refusals still come back coded at create, a bundle the fork server holds forks no child, and
the child's reply is bounded and shaped before anything is loaded from it."""

from __future__ import annotations

import ast
import asyncio
import json
import marshal
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._compile_child import (
    MAX_COMPILE_MEMORY_MB,
    MAX_REPLY_BYTES,
    parse_reply,
)
from suaveplan_sandbox.vm._guest import PluginBundle, load_plugin
from suaveplan_sandbox.vm._guest._loader import _MAX_SOURCE
from suaveplan_sandbox.vm._zygote import ForkServer, _refusal, fork_server

GOOD = "def f():\n    return 1\n"
MB = 1024 * 1024


def _create(path: Path, **kwargs: Any) -> object:
    policy = PermissionPolicy.from_manifest({"name": "compile"}, root=path.parent)

    async def main() -> object:
        async with await create_vm_sandbox(plugin_module_path=path, policy=policy, **kwargs) as sb:
            return await sb.call("f")

    return asyncio.run(main())


def _refused(path: Path, **kwargs: Any) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        _create(path, **kwargs)
    return info.value


def _names_list(size: int) -> str:
    """`x = [a,a,...]` of `size` characters: ~700 bytes of parser memory per source byte."""
    head, tail = "x = [", "]\n"
    return head + "a," * ((size - len(head) - len(tail)) // 2) + tail


def _zygote_rss() -> int:
    pid = fork_server().pid
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.timeout(300)
def test_a_plugin_costing_gigabytes_to_parse_is_refused_and_the_host_does_not_grow(
    tmp_path: Path,
) -> None:
    (tmp_path / "ok.py").write_text(GOOD)
    assert _create(tmp_path / "ok.py") == 1  # the fork server is up: its start is not counted
    hostile = tmp_path / "hostile.py"
    hostile.write_text(_names_list(_MAX_SOURCE))  # right at the bound: it is read
    assert hostile.stat().st_size > _MAX_SOURCE - 8
    server = fork_server()
    zygote, starts, zygote_rss = server.pid, server.starts, _zygote_rss()
    host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    err = _refused(hostile)

    # Parsed in this process, it would grow it by about 2.7 GB.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - host_peak < 200 * MB
    assert (err.code, err.details) == (
        "SAND_VM_SYNTAX_FORBIDDEN",
        {"reason": "too-complex-to-compile", "resource": "memory", "file": "hostile.py"},
    )
    # The fork server survived, did not keep the parse's memory, and serves the next create.
    assert (server.ping(), server.starts) == (zygote, starts)
    assert _zygote_rss() - zygote_rss < 64 * MB
    assert _create(tmp_path / "ok.py") == 1


def test_the_host_never_parses_plugin_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_parsing(*args: object, **kwargs: object) -> object:
        raise AssertionError("plugin source parsed in the host")

    monkeypatch.setattr(ast, "parse", no_parsing)
    (tmp_path / "p.py").write_text("import json\n\ndef f():\n    return json.dumps([1])\n")
    assert _create(tmp_path / "p.py") == "[1]"
    (tmp_path / "bad.py").write_text("import os\n")
    assert _refused(tmp_path / "bad.py").code == "SAND_VM_MODULE_IMPORT_FORBIDDEN"


REFUSALS = [
    pytest.param(
        "import os\n",
        ("SAND_VM_MODULE_IMPORT_FORBIDDEN", {"module": "os", "file": "p.py", "line": 1}),
        id="forbidden-import",
    ),
    pytest.param(
        "from .missing import x\n",
        ("SAND_VM_MODULE_IMPORT_FORBIDDEN", {"module": ".missing", "file": "p.py", "line": 1}),
        id="relative-import-of-nothing",
    ),
    pytest.param(
        "def f(:\n    return 1\n",
        ("SAND_VM_SYNTAX_FORBIDDEN", {"file": "p.py", "line": 1}),
        id="does-not-parse",
    ),
    pytest.param(
        "async def f():\n    return 1\n",
        ("SAND_VM_SYNTAX_FORBIDDEN", None),
        id="unreviewed-syntax",
    ),
    pytest.param(
        "def f():\n    return f.__globals__\n",
        ("SAND_VM_ATTRIBUTE_FORBIDDEN", None),
        id="dunder-attribute",
    ),
]


@pytest.mark.parametrize(("source", "expected"), REFUSALS)
def test_the_checkers_refusals_still_come_back_coded_at_create(
    tmp_path: Path, source: str, expected: tuple[str, dict[str, object] | None]
) -> None:
    (tmp_path / "p.py").write_text(source)
    err = _refused(tmp_path / "p.py")
    code, details = expected
    assert err.code == code
    if details is not None:
        assert err.details == details
    assert _create(_write(tmp_path / "ok.py", GOOD)) == 1


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_source_needing_the_unicode_database_compiles_in_the_hardened_child(
    tmp_path: Path,
) -> None:
    # `\N{...}` makes the parser import unicodedata: the child cannot open a file for it.
    (tmp_path / "p.py").write_text('def f():\n    return "\\N{EM DASH}" + f"{1 + 1}"\n')
    assert _create(tmp_path / "p.py") == "\u20142"


def _compiles() -> int:
    server = fork_server()
    server.ping()
    return server.compiles


def test_a_bundle_the_fork_server_holds_forks_no_compile_child(tmp_path: Path) -> None:
    plugin = _write(tmp_path / "held.py", "def f():\n    return 7\n")
    before = _compiles()
    assert _create(plugin) == 7
    assert _compiles() == before + 1
    for _ in range(3):
        assert _create(plugin) == 7
    assert _compiles() == before + 1
    # Nor does a refusal it remembers (one that depends on the source alone): the first
    # create of it checks in a child, the next ones get the same coded error without one.
    bad = _write(tmp_path / "bad.py", "import socket\n")
    for _ in range(3):
        assert _refused(bad).code == "SAND_VM_MODULE_IMPORT_FORBIDDEN"
        assert _compiles() == before + 2


def test_the_compile_memory_is_a_limit_of_each_load(tmp_path: Path) -> None:
    # About 200 KB of `[f,f,...]`: well within the default, not within 64 MB.
    body = "def f():\n    return 1\n\nx = [" + "f," * 100_000 + "]\n"
    bundle = load_plugin(_write(tmp_path / "small.py", body), _without_interpreter_layer=True)
    server = ForkServer()  # a private zygote: the process-wide one stays untouched
    try:
        with pytest.raises(SuaveplanError) as info:
            server.load(bundle, compile_memory_mb=64)
        assert (info.value.code, info.value.details) == (
            "SAND_VM_SYNTAX_FORBIDDEN",
            {"reason": "too-complex-to-compile", "resource": "memory", "file": "small.py"},
        )
        assert not server.holds(bundle.digest)
        server.load(bundle)
        assert server.holds(bundle.digest)
        pid = server.pid
        for n, bad in enumerate((0, 63, MAX_COMPILE_MEMORY_MB + 1)):
            other = load_plugin(
                _write(tmp_path / f"o{n}.py", GOOD), _without_interpreter_layer=True
            )
            with pytest.raises(SuaveplanError) as info:
                server.load(other, compile_memory_mb=bad)
            assert (info.value.code, info.value.details["why"]) == (
                "SAND_VM_FORK_SERVER_FAILED",
                "bad-compile-limits",
            )
        assert (server.ping(), server.starts) == (pid, 1)
    finally:
        server.shutdown()


# Runs `compile_in_child` in a fresh interpreter (forking this multi-threaded test process
# would not be safe) with one limit lowered, and prints the outcome as JSON. A child that
# came back out of `compile_in_child` would print ESCAPED.
_SCENARIO = r"""
import json, os, sys
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm import _compile_child as cc
from suaveplan_sandbox.vm._guest import load_plugin

def boom(bundle):
    raise KeyboardInterrupt

bundle = load_plugin(sys.argv[1])
limits = {
    "cpu": cc.CompileLimits(cpu_seconds=1),
    "time": cc.CompileLimits(wall_seconds=0.1),
    "output": cc.CompileLimits(max_reply_bytes=100),
    "escape": cc.CompileLimits(),
}[sys.argv[2]]
if sys.argv[2] == "escape":
    cc.compile_bundle = boom
parent = os.getpid()
try:
    cc.compile_in_child(bundle, limits, plan=None)
    out = {"ok": True}
except SuaveplanError as exc:
    out = {"code": exc.code, "reason": exc.details.get("reason"),
           "resource": exc.details.get("resource")}
if os.getpid() != parent:
    print("ESCAPED", flush=True)
    os._exit(0)
print(json.dumps(out), flush=True)
"""


def _ordinary(size: int) -> str:
    parts: list[str] = []
    total = 0
    while total < size:
        i = len(parts)
        parts.append(
            f"def f{i}(x, y=3):\n    total = 0\n    for k in range(x):\n"
            f"        if k % 3 == 0 and y > 1:\n            total += k * y - {i}\n"
            f"    return {{'a': [x, total]}}\n\n"
        )
        total += len(parts[-1])
    return "".join(parts)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("scenario", "size", "resource_name"),
    [
        ("cpu", 2 * MB, "cpu"),
        ("time", 1 * MB, "time"),
        ("output", 1000, "output"),
        ("escape", 1000, "crashed"),
    ],
)
def test_a_compile_child_stopped_by_a_limit_or_failing_is_a_coded_refusal(
    tmp_path: Path, scenario: str, size: int, resource_name: str
) -> None:
    (tmp_path / "p.py").write_text(_ordinary(size))
    out = subprocess.run(
        [sys.executable, "-c", _SCENARIO, str(tmp_path / "p.py"), scenario],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert "ESCAPED" not in out.stdout, out.stdout
    assert json.loads(out.stdout) == {
        "code": "SAND_VM_SYNTAX_FORBIDDEN",
        "reason": "too-complex-to-compile",
        "resource": resource_name,
    }, out.stderr


def _bundle(tmp_path: Path) -> PluginBundle:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import X\n")
    (pkg / "a.py").write_text("X = 1\n")
    return load_plugin(pkg)


def _code(source: str, filename: str) -> bytes:
    return marshal.dumps(compile(source, filename, "exec"))


def _frame(obj: object) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


def _good_modules(bundle: PluginBundle) -> list[list[object]]:
    return [[m.name, _code(m.source, m.filename)] for m in bundle.modules]


def test_a_well_formed_reply_loads_each_modules_code(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    compiled = parse_reply(_frame({"modules": _good_modules(bundle)}), bundle)
    assert list(compiled.modules) == [m.name for m in bundle.modules]
    assert compiled.modules["pkg.a"].code.co_filename == "a.py"
    assert compiled.modules["pkg"].is_package


def _malformed(bundle: PluginBundle) -> dict[str, bytes]:
    good = _good_modules(bundle)
    first, second = good
    return {
        "not-msgpack": b"\xc1",
        "truncated": _frame({"modules": good})[:-3],
        "a-list": _frame(good),
        "extra-key": _frame({"modules": good, "more": 1}),
        "both": _frame({"modules": good, "error": {"code": "SAND_VM_SYNTAX_FORBIDDEN"}}),
        "missing-module": _frame({"modules": [first]}),
        "extra-module": _frame({"modules": [*good, ["pkg.b", first[1]]]}),
        "other-order": _frame({"modules": [second, first]}),
        "renamed-module": _frame({"modules": [first, ["pkg.b", second[1]]]}),
        "code-as-str": _frame({"modules": [first, [second[0], "X = 1"]]}),
        "not-marshal": _frame({"modules": [first, [second[0], b"\x00garbage"]]}),
        "marshal-of-a-number": _frame({"modules": [first, [second[0], marshal.dumps(42)]]}),
        "code-of-another-file": _frame(
            {"modules": [first, [second[0], _code("X = 1", "elsewhere.py")]]}
        ),
        "host-only-code": _frame(
            {"error": {"code": "SAND_VM_FORK_SERVER_FAILED", "message": "m", "details": {}}}
        ),
        "budget-code": _frame(
            {"error": {"code": "BUDGET_EXCEEDED", "message": "m", "details": {}}}
        ),
        "unknown-code": _frame({"error": {"code": "NOPE", "message": "m", "details": {}}}),
        "error-not-a-map": _frame({"error": "SAND_VM_SYNTAX_FORBIDDEN"}),
        "memory-not-bool": _frame(
            {
                "error": {"code": "SAND_VM_SYNTAX_FORBIDDEN", "message": "m", "details": {}},
                "memory": 1,
            }
        ),
        "oversized": b"\x00" * (MAX_REPLY_BYTES + 1),
    }


MALFORMED = [
    "not-msgpack",
    "truncated",
    "a-list",
    "extra-key",
    "both",
    "missing-module",
    "extra-module",
    "other-order",
    "renamed-module",
    "code-as-str",
    "not-marshal",
    "marshal-of-a-number",
    "code-of-another-file",
    "host-only-code",
    "budget-code",
    "unknown-code",
    "error-not-a-map",
    "memory-not-bool",
    "oversized",
]


def test_every_malformed_case_is_listed(tmp_path: Path) -> None:
    assert sorted(_malformed(_bundle(tmp_path))) == sorted(MALFORMED)


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_or_oversized_reply_is_refused_before_anything_is_loaded(
    tmp_path: Path, case: str
) -> None:
    bundle = _bundle(tmp_path)
    frame = _malformed(bundle)[case]
    with pytest.raises(SuaveplanError) as info:
        parse_reply(frame, bundle)
    assert (info.value.code, info.value.details) == (
        "SAND_VM_SYNTAX_FORBIDDEN",
        {"reason": "too-complex-to-compile", "resource": "crashed", "why": "bad-reply"},
    )


def test_a_refusal_reply_is_raised_with_its_own_code(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    wire = {
        "code": "SAND_VM_MODULE_IMPORT_FORBIDDEN",
        "message": "import is not allowed",
        "details": {"module": "os", "file": "a.py", "line": 1},
    }
    with pytest.raises(SuaveplanError) as info:
        parse_reply(_frame({"error": wire, "memory": False}), bundle)
    assert (info.value.code, info.value.details) == (wire["code"], wire["details"])
    # The parser's own MemoryError on deep nesting stays what the loader called it unless the
    # child's peak memory says the address-space limit was hit.
    deep = {
        "code": "SAND_VM_SYNTAX_FORBIDDEN",
        "message": "nested",
        "details": {"file": "a.py", "reason": "too-deeply-nested"},
    }
    for near, expected in (
        (False, {"file": "a.py", "reason": "too-deeply-nested"}),
        (True, {"file": "a.py", "reason": "too-complex-to-compile", "resource": "memory"}),
    ):
        with pytest.raises(SuaveplanError) as info:
            parse_reply(_frame({"error": deep, "memory": True}), bundle, near_memory_limit=near)
        assert info.value.details == expected


def test_the_host_passes_on_only_a_refusals_code_from_the_fork_server() -> None:
    forged = {"code": "BUDGET_EXCEEDED", "message": "m", "details": {"budget": "cpu"}}
    assert _refusal(forged).code == "SAND_VM_FORK_SERVER_FAILED"
    assert _refusal("garbage").code == "SAND_VM_FORK_SERVER_FAILED"
    real = {"code": "SAND_VM_SYNTAX_FORBIDDEN", "message": "m", "details": {"line": 3}}
    assert (_refusal(real).code, _refusal(real).details) == (real["code"], {"line": 3})
