"""Plugin source nested too deeply to parse, check or compile is the plugin's bad input: a
coded error at create, never the parser's `MemoryError` or `RecursionError` in the host."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._guest import load_plugin
from suaveplan_sandbox.vm._guest._runtime import compile_bundle

DEEP = {
    # Left-nested operators: a recursion past the interpreter's limit when checked.
    "sum": "x = 1" + "+1" * 5000,
    "attributes": "x = a" + ".b" * 5000,
    # Unary operators: CPython's parser runs out of its own stack (MemoryError).
    "negations": "x = " + "-" * 100_000 + "1",
    "nots": "x = " + "not " * 100_000 + "1",
}


def _create(tmp: Path, source: str) -> object:
    (tmp / "p.py").write_text(source + "\n\ndef f():\n    return 1\n")
    policy = PermissionPolicy.from_manifest({"name": "deep"}, root=tmp)

    async def main() -> object:
        async with await create_vm_sandbox(plugin_module_path=tmp / "p.py", policy=policy) as sb:
            return await sb.call("f")

    return asyncio.run(main())


@pytest.mark.parametrize("source", list(DEEP.values()), ids=list(DEEP))
def test_deeply_nested_source_is_refused_with_a_coded_error(tmp_path: Path, source: str) -> None:
    with pytest.raises(SuaveplanError) as info:
        _create(tmp_path, source)
    assert info.value.code == "SAND_VM_SYNTAX_FORBIDDEN"
    assert info.value.details == {"file": "p.py", "reason": "too-deeply-nested"}


def test_the_host_carries_on_after_a_refused_plugin(tmp_path: Path) -> None:
    with pytest.raises(SuaveplanError):
        _create(tmp_path, DEEP["sum"])
    assert _create(tmp_path, "x = 1" + "+1" * 100) == 1


@pytest.mark.parametrize(
    "source",
    ["x = 1" + "+1" * 100_000, DEEP["negations"]],  # compiled by 3.13 up to ~10,000 terms
    ids=["sum", "negations"],
)
def test_the_process_layer_alone_compile_gives_the_same_coded_error(
    tmp_path: Path, source: str
) -> None:
    # The test-only run without the in-interpreter layer compiles the raw source in the fork
    # server: the compiler's own limits surface as the same code.
    (tmp_path / "p.py").write_text(source + "\n")
    bundle = load_plugin(tmp_path / "p.py", _without_interpreter_layer=True)
    with pytest.raises(SuaveplanError) as info:
        compile_bundle(bundle)
    assert (info.value.code, info.value.details["reason"]) == (
        "SAND_VM_SYNTAX_FORBIDDEN",
        "too-deeply-nested",
    )
