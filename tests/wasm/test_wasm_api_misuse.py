"""A careless or hostile *caller* of `create_wasm_sandbox` gets a coded error, leaves nothing.

Wrong types and odd values for each argument are `SAND_INVALID_ARGUMENT` naming the argument,
refused before the module is read; an int "path" in particular is never taken for a file
descriptor (it used to be read as the module and closed: another owner's fd). A create that
fails part-way (a rule that cannot be a preopen after others were opened, a module that does
not compile, a refused WASI version, a start function that traps) returns the host's fds and
threads to their baseline.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from _create_argument_cases import COMMON_BAD_ARGUMENTS, bad_paths
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import _engine, create_wasm_sandbox, create_wasm_sandbox_blocking

ADD = '(module (func (export "add") (param i32 i32) (result i32) local.get 0 local.get 1 i32.add))'


def _policy(root: Path, fs: list[str] | None = None) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "misuse", "permissions": {"fs": fs or []}}, root=root
    )


def _resources() -> tuple[int, int]:
    """Open fds and threads (not the default executor's reused pool)."""
    gc.collect()
    threads = sum(1 for t in threading.enumerate() if not t.name.startswith("asyncio_"))
    return len(os.listdir("/proc/self/fd")), threads


async def _settled(baseline: tuple[int, int], timeout_s: float = 5.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout_s
    now = _resources()
    while now != baseline and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        now = _resources()
    return now


BAD_ARGUMENTS: list[tuple[str, object]] = [
    *bad_paths("wasm_module_path", optional=False),
    *COMMON_BAD_ARGUMENTS,
    *bad_paths("cache_dir", optional=True),
]


@pytest.mark.parametrize(
    ("argument", "value"),
    BAD_ARGUMENTS,
    ids=[f"{a}-{i}" for i, (a, _v) in enumerate(BAD_ARGUMENTS)],
)
async def test_a_create_argument_it_cannot_use_is_refused_before_the_module_is_read(
    root: Path,
    wat: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
    argument: str,
    value: object,
) -> None:
    kwargs: dict[str, Any] = {
        "wasm_module_path": wat(ADD),
        "policy": _policy(root),
        argument: value,
    }

    def never(*_a: object, **_k: object) -> None:
        raise AssertionError("the module was looked at before the arguments were checked")

    monkeypatch.setattr(_engine, "cached_module_file", never)
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(**kwargs)
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details["argument"] == argument


async def test_an_int_module_path_is_refused_and_never_taken_for_a_descriptor(root: Path) -> None:
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"\0asm\1\0\0\0")  # what an fd "module" would hold
        with pytest.raises(SuaveplanError) as info:
            await create_wasm_sandbox(wasm_module_path=read_end, policy=_policy(root))  # type: ignore[arg-type]
        assert info.value.details["argument"] == "wasm_module_path"
        os.fstat(read_end)  # still open: nobody else's descriptor was closed
        assert os.read(read_end, 16) == b"\0asm\1\0\0\0"  # and nothing was read from it
    finally:
        os.close(read_end)
        os.close(write_end)


def test_the_blocking_facade_refuses_a_bad_argument_and_stops_its_loop_thread(
    root: Path,
) -> None:
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(SuaveplanError) as info:
        create_wasm_sandbox_blocking(wasm_module_path=7, policy=_policy(root))
    assert info.value.details["argument"] == "wasm_module_path"
    assert {t.name for t in threading.enumerate()} <= before


async def test_valid_optional_arguments_are_still_accepted(
    root: Path, wat: Callable[[str], Path], tmp_path: Path
) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=str(wat(ADD)),
        policy=_policy(root),
        plugin_name="misuse-2",
        cache_dir=tmp_path / "cache",
    ) as sb:
        assert await sb.call("add", 2, 3) == 5


WASI_UNSTABLE = """
(module
  (import "wasi_unstable" "proc_exit" (func (param i32)))
  (func (export "f") (result i32) i32.const 1))
"""

TRAPPING_START = """
(module
  (func $boom unreachable)
  (start $boom)
  (func (export "f") (result i32) i32.const 1))
"""


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("preopen-denied-after-another-opened", "SAND_WASM_PREOPEN_DENIED"),
        ("module-does-not-compile", "SAND_WASM_INSTANTIATION_FAILED"),
        ("wasi-unstable", "SAND_WASM_WASI_VERSION_UNSUPPORTED"),
        ("start-function-traps", "SAND_WASM_TRAP"),
    ],
)
async def test_a_create_that_fails_part_way_leaves_no_fd_or_thread(
    root: Path, wat: Callable[[str], Path], tmp_path: Path, case: str, code: str
) -> None:
    async with await create_wasm_sandbox(  # warm-up: the engine and its epoch thread
        wasm_module_path=wat(ADD), policy=_policy(root, ["./uploads/*"])
    ):
        pass
    rules = ["./uploads/*"]
    module = wat(ADD)
    if case.startswith("preopen"):
        rules = ["./uploads/*", "./private/*.txt"]  # the first is opened, the second refused
    elif case == "module-does-not-compile":
        module = tmp_path / "garbage.wasm"
        module.write_bytes(b"\0asm\1\0\0\0garbage")
    elif case == "wasi-unstable":
        module = wat(WASI_UNSTABLE)
    else:
        module = wat(TRAPPING_START)
    baseline = _resources()
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(wasm_module_path=module, policy=_policy(root, rules))
    assert info.value.code == code
    assert await _settled(baseline) == baseline


_ADD_WAT = """
(module
  (func (export "add") (param i32 i32) (result i32) local.get 0 local.get 1 i32.add))
"""


def test_a_blocking_facade_dropped_without_dispose_ends_its_loop_thread(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # The daemon loop thread holds the sandbox through its loop: a facade dropped without
    # dispose() used to keep that thread, the guest's thread and their descriptors for the
    # life of the process. Its finalizer disposes it and stops the loop thread.
    module = wat(_ADD_WAT)
    with create_wasm_sandbox_blocking(wasm_module_path=module, policy=_policy(root)) as warm:
        assert warm.call("add", 1, 2) == 3
    baseline = _resources()
    sb = create_wasm_sandbox_blocking(wasm_module_path=module, policy=_policy(root))
    loop_thread = sb._loop  # for clean-up only: it does not keep the facade alive
    try:
        assert sb.call("add", 2, 3) == 5
        del sb
        deadline = time.monotonic() + 5  # measured outside any event loop, as the baseline
        while _resources() != baseline and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _resources() == baseline
    finally:
        if not loop_thread.loop.is_closed():
            loop_thread.stop()
