"""What a create reuses (file digest, import check, linked module) and what it must not."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import wasmtime

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing._fakes import DictSecrets
from suaveplan_sandbox.wasm import Errno, _engine, create_wasm_sandbox

ANSWER_WAT = '(module (func (export "answer") (result i32) (i32.const {n})))'
OLD_WASI_WAT = (
    '(module (import "wasi_unstable" "fd_write" (func (param i32 i32 i32 i32) (result i32))))'
)
WRONG_SIGNATURE_WAT = '(module (import "suaveplan" "sock_close" (func (param i64) (result i32))))'
# A start function runs during instantiation, before any call: its import must still find the
# guest's memory (looked up then, not the per-call cached export).
START_WAT = """
(module
  (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "API_KEY")
  (global $errno (mut i32) (i32.const -1))
  (func $start (global.set $errno
    (call $sg (i32.const 0) (i32.const 7) (i32.const 256) (i32.const 64) (i32.const 512))))
  (start $start)
  (func (export "start_errno") (result i32) (global.get $errno))
  (func (export "value") (result i32) (i32.load8_u (i32.const 256))))
"""


def policy(root: Path, **extra: object) -> PermissionPolicy:
    return PermissionPolicy.from_manifest({"name": "guest", **extra}, root=root)


async def test_rewriting_the_module_file_is_seen_by_the_next_create(
    root: Path, tmp_path: Path
) -> None:
    path = tmp_path / "answer.wasm"
    path.write_bytes(wasmtime.wat2wasm(ANSWER_WAT.format(n=1)))
    async with await create_wasm_sandbox(wasm_module_path=path, policy=policy(root)) as sb:
        assert await sb.call("answer") == 1
    # Same path, same size, and the old mtime put back: only the content (and ctime) differ.
    st = path.stat()
    path.write_bytes(wasmtime.wat2wasm(ANSWER_WAT.format(n=2)))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size
    async with await create_wasm_sandbox(wasm_module_path=path, policy=policy(root)) as sb:
        assert await sb.call("answer") == 2


async def test_a_refused_module_is_refused_again_on_every_create(
    root: Path, wat: Callable[[str], Path]
) -> None:
    path = wat(OLD_WASI_WAT)
    codes = []
    for _ in range(3):
        with pytest.raises(SuaveplanError) as info:
            await create_wasm_sandbox(wasm_module_path=path, policy=policy(root))
        codes.append(info.value.code)
    assert codes == ["SAND_WASM_WASI_VERSION_UNSUPPORTED"] * 3


async def test_a_module_that_fails_to_link_fails_on_every_create_with_the_cause(
    root: Path, wat: Callable[[str], Path]
) -> None:
    path = wat(WRONG_SIGNATURE_WAT)
    for _ in range(2):
        with pytest.raises(SuaveplanError) as info:
            await create_wasm_sandbox(wasm_module_path=path, policy=policy(root))
        assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
        assert isinstance(info.value.__cause__, wasmtime.WasmtimeError)


async def test_a_missing_module_file_is_coded_even_after_a_cached_create(
    root: Path, tmp_path: Path
) -> None:
    path = tmp_path / "gone.wasm"
    path.write_bytes(wasmtime.wat2wasm(ANSWER_WAT.format(n=3)))
    async with await create_wasm_sandbox(wasm_module_path=path, policy=policy(root)):
        pass
    path.unlink()
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(wasm_module_path=path, policy=policy(root))
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert info.value.details == {"stage": "read"}


class _SyncSecrets:
    def __init__(self) -> None:
        self.requested: list[str] = []

    def get(self, name: str) -> str:
        self.requested.append(name)
        return "k"


async def test_an_import_called_by_a_start_function_reads_guest_memory(
    root: Path, wat: Callable[[str], Path]
) -> None:
    secrets = _SyncSecrets()
    async with await create_wasm_sandbox(
        wasm_module_path=wat(START_WAT),
        policy=policy(root, secrets=[{"name": "API_KEY"}]),
        proxies=Adapters(secrets=secrets),
    ) as sb:
        assert secrets.requested == ["API_KEY"]
        assert await sb.call("start_errno") == 0
        assert await sb.call("value") == ord("k")


async def test_a_start_function_awaits_an_async_adapter_without_deadlocking_create(
    root: Path, wat: Callable[[str], Path]
) -> None:
    # The start function runs on the guest thread while create awaits it, so an async
    # adapter is awaited on the (free) event loop like in any call.
    secrets = DictSecrets({"API_KEY": "k"})
    sb = await asyncio.wait_for(
        create_wasm_sandbox(
            wasm_module_path=wat(START_WAT),
            policy=policy(root, secrets=[{"name": "API_KEY"}]),
            proxies=Adapters(secrets=secrets),
        ),
        timeout=10,
    )
    async with sb:
        assert await sb.call("start_errno") == Errno.SUCCESS
        assert await sb.call("value") == ord("k")
        assert secrets.requested == ["API_KEY"]


async def test_repeated_creates_compile_once_and_read_the_file_once(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "once.wasm"
    path.write_bytes(wasmtime.wat2wasm(ANSWER_WAT.format(n=4)))
    loads: list[int] = []
    real = _engine.load_module

    def counting(wasm: bytes, **kwargs: object) -> wasmtime.Module:
        loads.append(len(wasm))
        return real(wasm, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_engine, "load_module", counting)
    before = _engine.compile_count()
    for _ in range(3):
        async with await create_wasm_sandbox(wasm_module_path=path, policy=policy(root)) as sb:
            assert await sb.call("answer") == 4
    assert _engine.compile_count() - before == 1
    assert len(loads) == 1


async def test_a_module_file_larger_than_max_module_bytes_is_refused_before_it_is_read(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sized.wasm"
    path.write_bytes(wasmtime.wat2wasm(ANSWER_WAT.format(n=11)))
    size = path.stat().st_size
    loads: list[int] = []
    real = _engine.load_module

    def counting(wasm: bytes, **kwargs: object) -> wasmtime.Module:
        loads.append(len(wasm))
        return real(wasm, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_engine, "load_module", counting)
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=path, policy=policy(root), max_module_bytes=size - 1
        )
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert info.value.details == {"stage": "read", "limit": size - 1}
    assert loads == []
    async with await create_wasm_sandbox(
        wasm_module_path=path, policy=policy(root), max_module_bytes=size
    ) as sb:
        assert await sb.call("answer") == 11
    # A module loaded before is still refused under a smaller limit.
    with pytest.raises(SuaveplanError) as again:
        await create_wasm_sandbox(
            wasm_module_path=path, policy=policy(root), max_module_bytes=size - 1
        )
    assert again.value.details == {"stage": "read", "limit": size - 1}


async def test_the_default_max_module_bytes_is_128_mib(root: Path, tmp_path: Path) -> None:
    path = tmp_path / "huge.wasm"
    with path.open("wb") as fh:  # sparse: costs no disk
        fh.write(wasmtime.wat2wasm(ANSWER_WAT.format(n=1)))
        fh.truncate(128 * 1024 * 1024 + 1)
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(wasm_module_path=path, policy=policy(root))
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert info.value.details == {"stage": "read", "limit": 128 * 1024 * 1024}


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, None])
async def test_max_module_bytes_must_be_a_positive_int(
    root: Path, wat: Callable[[str], Path], bad: object
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=wat(ANSWER_WAT.format(n=1)),
            policy=policy(root),
            max_module_bytes=bad,  # type: ignore[arg-type]
        )
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details == {"argument": "max_module_bytes"}


async def test_the_event_loop_runs_other_tasks_while_a_new_module_compiles(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fresh.wasm"
    path.write_bytes(wasmtime.wat2wasm(ANSWER_WAT.format(n=12)))
    loop_turned = threading.Event()
    seen: list[bool] = []
    real = _engine.load_module

    def waiting(wasm: bytes, **kwargs: object) -> wasmtime.Module:
        # Stands in for a slow rewrite and compile: does the loop run meanwhile?
        seen.append(loop_turned.wait(5))
        return real(wasm, **kwargs)  # type: ignore[arg-type]

    async def turn() -> None:
        loop_turned.set()

    monkeypatch.setattr(_engine, "load_module", waiting)
    task = asyncio.create_task(turn())
    async with await create_wasm_sandbox(wasm_module_path=path, policy=policy(root)) as sb:
        assert await sb.call("answer") == 12
    await task
    assert seen == [True]
