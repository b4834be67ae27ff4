"""`run` keeps at most `max_output_bytes` of stdout and of stderr; writes past it fail."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import (
    RunResult,
    _output,
    _sandbox,
    create_wasm_sandbox,
    create_wasm_sandbox_blocking,
)

WASI_EIO = 29

# `count` writes of `size` bytes to `fd`, write i filled with the letter 'A' + i % 26. Then
# a 12-byte record on `other`: the 1-based index of the first write that failed (0: none),
# how many failed, and the errno of the last failure.
WRITER_WAT = """
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") {pages})
  (func (export "_start")
    (local $i i32) (local $r i32) (local $first i32) (local $fails i32) (local $last i32)
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const {size}))
    (loop $l
      (memory.fill (i32.const 1024)
        (i32.add (i32.const 65) (i32.rem_u (local.get $i) (i32.const 26))) (i32.const {size}))
      (local.set $r (call $w (i32.const {fd}) (i32.const 0) (i32.const 1) (i32.const 8)))
      (if (local.get $r) (then
        (local.set $fails (i32.add (local.get $fails) (i32.const 1)))
        (local.set $last (local.get $r))
        (if (i32.eqz (local.get $first))
          (then (local.set $first (i32.add (local.get $i) (i32.const 1)))))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const {count}))))
    (i32.store (i32.const 16) (local.get $first))
    (i32.store (i32.const 20) (local.get $fails))
    (i32.store (i32.const 24) (local.get $last))
    (i32.store (i32.const 32) (i32.const 16))
    (i32.store (i32.const 36) (i32.const 12))
    (drop (call $w (i32.const {other}) (i32.const 32) (i32.const 1) (i32.const 8)))))
"""
# Writes 4 KiB to stdout until the wall clock ends it.
ENDLESS_WAT = """
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 4096))
    (loop $l
      (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (br $l))))
"""


def policy(root: Path, **budgets: int) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"budgets": budgets}}, root=root
    )


def writer(
    wat: Callable[[str], Path], *, size: int, count: int, fd: int = 1, pages: int = 1
) -> Path:
    return wat(WRITER_WAT.format(size=size, count=count, fd=fd, other=3 - fd, pages=pages))


def written(size: int, count: int) -> bytes:
    return b"".join(bytes([65 + i % 26]) * size for i in range(count))


def record(data: bytes) -> tuple[int, int, int]:
    first, fails, last = struct.unpack("<III", data)
    return first, fails, last


class CountingCapture:
    """Stands in for `OutputCapture` in `_sandbox`: counts the callbacks wasmtime makes."""

    made: list[CountingCapture] = []  # noqa: RUF012 — reset per test by `counting`

    def __init__(self, limit: int) -> None:
        self.inner = _output.OutputCapture(limit)
        self.calls = 0
        CountingCapture.made.append(self)

    def __call__(self, data: bytes) -> int | None:
        self.calls += 1
        return self.inner(data)

    def take(self) -> bytes:
        return self.inner.take()

    @property
    def truncated(self) -> bool:
        return self.inner.truncated


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> list[CountingCapture]:
    CountingCapture.made = []
    monkeypatch.setattr(_sandbox, "OutputCapture", CountingCapture)
    return CountingCapture.made


async def run(path: Path, root: Path, limit: int | None = None, **budgets: int) -> RunResult:
    limits = _output.DEFAULT_MAX_OUTPUT_BYTES if limit is None else limit
    async with await create_wasm_sandbox(
        wasm_module_path=path, policy=policy(root, **budgets), max_output_bytes=limits
    ) as sb:
        return await sb.run()


async def run_with_defaults(path: Path, root: Path) -> RunResult:
    async with await create_wasm_sandbox(wasm_module_path=path, policy=policy(root)) as sb:
        return await sb.run()


async def test_stdout_keeps_the_first_max_output_bytes_and_reports_the_truncation(
    root: Path, wat: Callable[[str], Path]
) -> None:
    res = await run(writer(wat, size=1000, count=10), root, limit=2500)
    assert res.stdout == written(1000, 10)[:2500]
    assert res.stdout_truncated
    assert not res.stderr_truncated
    # The third write crossed the limit: it and every later one failed with EIO.
    assert record(res.stderr) == (3, 8, WASI_EIO)
    assert res.exit_code == 0


async def test_output_that_exactly_fills_the_limit_is_whole_and_not_truncated(
    root: Path, wat: Callable[[str], Path]
) -> None:
    res = await run(writer(wat, size=1000, count=3), root, limit=3000)
    assert res.stdout == written(1000, 3)
    assert not res.stdout_truncated
    assert record(res.stderr) == (0, 0, 0)


async def test_many_small_writes_stop_at_the_limit_and_later_ones_never_reach_the_host(
    root: Path, wat: Callable[[str], Path], counting: list[CountingCapture]
) -> None:
    res = await run(writer(wat, size=1, count=50_000), root, limit=1000)
    assert res.stdout == written(1, 1000)
    assert res.stdout_truncated
    assert record(res.stderr) == (1001, 49_000, WASI_EIO)
    out, _err = counting
    # wasmtime closes a stream whose callback failed: the 48,999 writes after the one that
    # crossed the limit failed without a call into the host.
    assert out.calls == 1001


async def test_stderr_has_its_own_limit(root: Path, wat: Callable[[str], Path]) -> None:
    res = await run(writer(wat, size=1000, count=10, fd=2), root, limit=2500)
    assert res.stderr == written(1000, 10)[:2500]
    assert res.stderr_truncated
    assert not res.stdout_truncated
    assert record(res.stdout) == (3, 8, WASI_EIO)


async def test_one_write_of_a_buffer_larger_than_the_limit_keeps_only_the_limit(
    root: Path, wat: Callable[[str], Path], counting: list[CountingCapture]
) -> None:
    size = 8 * 1024 * 1024
    res = await run(writer(wat, size=size, count=1, pages=130), root, limit=65536)
    assert res.stdout == b"A" * 65536
    assert res.stdout_truncated
    assert record(res.stderr) == (1, 1, WASI_EIO)
    out, _err = counting
    assert out.calls <= 65536 // 4096 + 1  # wasmtime hands over 4 KiB at a time


async def test_a_limit_of_zero_keeps_nothing(root: Path, wat: Callable[[str], Path]) -> None:
    res = await run(writer(wat, size=10, count=2), root, limit=0)
    assert (res.stdout, res.stderr) == (b"", b"")
    assert res.stdout_truncated
    assert res.stderr_truncated  # the guest's 12-byte record went nowhere either
    assert res.exit_code == 0


async def test_the_default_limit_is_one_mib_per_stream(
    root: Path, wat: Callable[[str], Path]
) -> None:
    res = await run_with_defaults(writer(wat, size=60_000, count=20, pages=2), root)
    assert res.stdout == written(60_000, 20)[: 1024 * 1024]
    assert res.stdout_truncated


async def test_output_racing_the_wall_clock_stays_within_the_limit(
    root: Path, wat: Callable[[str], Path], counting: list[CountingCapture]
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await run(wat(ENDLESS_WAT), root, limit=100_000, wallClockMs=200)
    assert info.value.code == "BUDGET_EXCEEDED"
    assert info.value.details["budget"] == "wallClockMs"
    out, err = counting
    assert out.truncated
    assert len(out.take()) == 100_000
    assert out.calls == 100_000 // 4096 + 1
    assert err.take() == b""
    # A write arriving after the run ended is refused, not kept.
    late = out(b"late")
    assert late is not None and late < 0
    assert len(out.take()) == 100_000


@pytest.mark.parametrize("bad", [-1, True, 1.5, "10", None])
async def test_max_output_bytes_must_be_a_non_negative_int(
    root: Path, wat: Callable[[str], Path], bad: object
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=writer(wat, size=1, count=1),
            policy=policy(root),
            max_output_bytes=bad,  # type: ignore[arg-type]
        )
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details == {"argument": "max_output_bytes"}


def test_the_blocking_facade_takes_the_limit(root: Path, wat: Callable[[str], Path]) -> None:
    with create_wasm_sandbox_blocking(
        wasm_module_path=writer(wat, size=1000, count=10),
        policy=policy(root),
        max_output_bytes=1500,
    ) as sb:
        res = sb.run()
    assert res.stdout == written(1000, 10)[:1500]
    assert res.stdout_truncated
