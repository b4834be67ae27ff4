"""The WASM host: WASI snapshot from policy, versions, host imports, budgets, dispose."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing._fakes import DictSecrets, FakeDb, FakeFetch
from suaveplan_sandbox.wasm import Errno, _engine, _sandbox, create_wasm_sandbox
from suaveplan_sandbox.wasm._instrument import Instrumented, instrument

FIXTURES = Path(__file__).parent / "fixtures"
FSPROBE = FIXTURES / "fsprobe.wasm"
WASI_PERM = 63  # wasi-libc errno == WASI errno numbering; `perm`

IMPORTS_WAT = """
(module
  (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
  (import "suaveplan" "sock_connect" (func $sc (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "API_KEY")
  (data (i32.const 16) "OTHER_KEY")
  (data (i32.const 32) "api.stripe.com")
  (data (i32.const 64) "evil.example.com")
  (func (export "secret") (param $p i32) (param $l i32) (result i32)
    (call $sg (local.get $p) (local.get $l) (i32.const 256) (i32.const 64) (i32.const 512)))
  (func (export "secret_raw") (param i32 i32 i32 i32 i32) (result i32)
    (call $sg (local.get 0) (local.get 1) (local.get 2) (local.get 3) (local.get 4)))
  (func (export "connect") (param $p i32) (param $l i32) (result i32)
    (call $sc (local.get $p) (local.get $l) (i32.const 443) (i32.const 520)))
  (func (export "load") (param i32) (result i32) (i32.load (local.get 0))))
"""


def policy(root: Path, **permissions: object) -> PermissionPolicy:
    extra: dict[str, object] = {
        key: permissions.pop(key) for key in ("secrets", "events") if key in permissions
    }
    return PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": permissions, **extra}, root=root
    )


def _sockets_open() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            continue
    return count


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# Every socket object this process creates raises the `socket.__new__` audit event (also one
# made and closed within a call, which a before/after fd count cannot see). An audit hook
# cannot be removed, so one hook counts while `_SOCKETS_MADE` is armed.
_SOCKETS_MADE: list[int] = []


def _count_sockets(event: str, _args: tuple[object, ...]) -> None:
    if event == "socket.__new__" and _SOCKETS_MADE:
        _SOCKETS_MADE[0] += 1


sys.addaudithook(_count_sockets)


@contextlib.contextmanager
def _sockets_made() -> Iterator[list[int]]:
    """While the block runs, `made[0]` counts socket objects created in this process."""
    _SOCKETS_MADE[:] = [0]
    try:
        yield _SOCKETS_MADE
    finally:
        _SOCKETS_MADE.clear()


# -- WASI snapshot from policy -------------------------------------------------------------


async def test_uploads_rule_preopens_uploads_only_and_read_only(root: Path) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=FSPROBE, policy=policy(root, fs=["./uploads/*"])
    ) as sb:
        assert [(p.guest, p.writable) for p in sb.preopens] == [("/uploads", False)]
        ok = await sb.run(argv=["fsprobe", "read", "/uploads/a.txt"])
        assert (ok.exit_code, ok.stdout) == (0, b"ok hello\n")
        other = await sb.run(argv=["fsprobe", "read", "/private/s.txt"])
        assert other.exit_code == 1


async def test_write_into_read_only_preopen_gets_wasi_perm(root: Path) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=FSPROBE, policy=policy(root, fs=["./uploads/*"])
    ) as sb:
        res = await sb.run(argv=["fsprobe", "write", "/uploads/new.txt"])
    assert res.stdout == f"errno {WASI_PERM}\n".encode()
    assert not (root / "uploads" / "new.txt").exists()


async def test_rw_prefix_makes_the_preopen_writable(root: Path) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=FSPROBE, policy=policy(root, fs=["rw:./uploads/*"])
    ) as sb:
        assert sb.preopens[0].writable
        res = await sb.run(argv=["fsprobe", "write", "/uploads/new.txt", "hi"])
    assert res.exit_code == 0
    assert (root / "uploads" / "new.txt").read_text() == "hi"


async def test_dotdot_escape_from_a_preopen_fails(root: Path) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=FSPROBE, policy=policy(root, fs=["rw:./uploads/*"])
    ) as sb:
        res = await sb.run(argv=["fsprobe", "read", "/uploads/../private/s.txt"])
        wrote = await sb.run(argv=["fsprobe", "write", "/uploads/../private/s.txt", "pwned"])
        created = await sb.run(argv=["fsprobe", "write", "/uploads/../../outside.txt"])
    assert res.exit_code == 1
    assert b"secret" not in res.stdout
    assert (wrote.exit_code, created.exit_code) == (1, 1)
    assert (root / "private" / "s.txt").read_text() == "secret"
    assert not (root.parent / "outside.txt").exists()


async def test_symlink_inside_a_preopen_pointing_outside_cannot_be_opened(root: Path) -> None:
    (root / "uploads" / "link").symlink_to(root / "private" / "s.txt")
    (root / "uploads" / "dirlink").symlink_to(root / "private")
    async with await create_wasm_sandbox(
        wasm_module_path=FSPROBE, policy=policy(root, fs=["rw:./uploads/*"])
    ) as sb:
        res = await sb.run(argv=["fsprobe", "read", "/uploads/link"])
        res2 = await sb.run(argv=["fsprobe", "read", "/uploads/dirlink/s.txt"])
        # The preopen is writable: writing through either link must not reach the target.
        wrote = await sb.run(argv=["fsprobe", "write", "/uploads/link", "pwned"])
        wrote2 = await sb.run(argv=["fsprobe", "write", "/uploads/dirlink/s.txt", "pwned"])
        made = await sb.run(argv=["fsprobe", "write", "/uploads/dirlink/new.txt"])
    assert res.exit_code == 1 and b"secret" not in res.stdout
    assert res2.exit_code == 1 and b"secret" not in res2.stdout
    assert (wrote.exit_code, wrote2.exit_code, made.exit_code) == (1, 1, 1)
    assert (root / "private" / "s.txt").read_text() == "secret"
    assert not (root / "private" / "new.txt").exists()


@pytest.mark.parametrize("rule", ["./uploads/a.txt", "./uploads/*.txt", "./up*/a"])
async def test_rule_not_expressible_as_preopen_is_refused_and_counted(
    root: Path, rule: str
) -> None:
    metrics = InMemoryMetrics()
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=FSPROBE, policy=policy(root, fs=[rule]), metrics=metrics
        )
    assert info.value.code == "SAND_WASM_PREOPEN_DENIED"
    assert (
        metrics.value(
            "plugin.permission_denied_total",
            plugin="guest",
            capability="fs",
            reason="path-not-in-allowlist",
        )
        == 1
    )


async def test_a_directory_rule_through_a_symlink_leaving_the_root_is_refused(
    root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    metrics = InMemoryMetrics()
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=FSPROBE, policy=policy(root, fs=["./escape/*"]), metrics=metrics
        )
    assert info.value.code == "SAND_WASM_PREOPEN_DENIED"
    assert metrics.value("plugin.permission_denied_total", plugin="guest", capability="fs") == 1


async def test_nothing_is_inherited_argv_env_or_stdio(root: Path) -> None:
    async with await create_wasm_sandbox(wasm_module_path=FSPROBE, policy=policy(root)) as sb:
        res = await sb.run(argv=["fsprobe", "echo", "-"], stdin=b"given")
    assert (res.exit_code, res.stdout, res.stderr) == (7, b"given", b"err\n")


WASI_COUNTS_WAT = """
(module
  (import "wasi_snapshot_preview1" "environ_sizes_get"
    (func $env (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_prestat_get" (func $prestat (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "env_count") (result i32)
    (drop (call $env (i32.const 0) (i32.const 4))) (i32.load (i32.const 0)))
  (func (export "arg_count") (result i32)
    (drop (call $args (i32.const 0) (i32.const 4))) (i32.load (i32.const 0)))
  (func (export "prestat") (param i32) (result i32) (call $prestat (local.get 0) (i32.const 8))))
"""


async def test_the_guest_sees_no_host_env_args_or_preopens_it_was_not_given(
    root: Path, wat: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUAVEPLAN_HOST_SECRET", "leak")
    assert len(os.environ) > 1
    async with await create_wasm_sandbox(
        wasm_module_path=wat(WASI_COUNTS_WAT), policy=policy(root)
    ) as sb:
        assert await sb.call("env_count") == 0
        assert await sb.call("arg_count") == 0
        assert await sb.call("prestat", 3) == 8  # BADF: fd 3 is no preopen, none was granted
    async with await create_wasm_sandbox(
        wasm_module_path=wat(WASI_COUNTS_WAT), policy=policy(root, fs=["./uploads/*"])
    ) as sb:
        assert await sb.call("prestat", 3) == 0  # the one granted preopen
        assert await sb.call("prestat", 4) == 8  # and nothing after it


# -- versions and instantiation ------------------------------------------------------------


@pytest.mark.parametrize(
    "module",
    ["wasi_unstable", "wasi_snapshot_preview0", "wasi_snapshot_preview2", "wasi:cli/env@0.2.0"],
)
async def test_old_wasi_versions_are_refused_before_instantiation(
    root: Path, wat: Callable[[str], Path], module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = wat(
        f'(module (import "{module}" "fd_write" (func (param i32 i32 i32 i32) (result i32))))'
    )

    def never(*_: object) -> None:
        raise AssertionError("the module was linked or instantiated")

    # Neither linking (InstancePre) nor instantiation may be reached.
    monkeypatch.setattr(_sandbox, "_instance_pre", never)
    monkeypatch.setattr(_sandbox.WasmSandbox, "_instantiate", never)
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(wasm_module_path=path, policy=policy(root))
    assert info.value.code == "SAND_WASM_WASI_VERSION_UNSUPPORTED"
    assert info.value.details["module"] == module


@pytest.mark.parametrize(
    "text",
    [
        '(module (import "env" "f" (func)))',
        '(module (import "wasi_snapshot_preview1" "no_such_call" (func)))',
        '(module (import "wasi_snapshot_preview1" "fd_write" (func (param i32))))',
    ],
    ids=["unknown-module", "missing-import", "wrong-signature"],
)
async def test_other_instantiation_failures_are_coded(
    root: Path, wat: Callable[[str], Path], text: str
) -> None:
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(wasm_module_path=wat(text), policy=policy(root))
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"


async def test_bad_bytes_fail_with_the_cause_chained(root: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.wasm"
    bad.write_bytes(b"\0asm\x02\0\0\0garbage")
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(wasm_module_path=bad, policy=policy(root))
    assert info.value.code == "SAND_WASM_INSTANTIATION_FAILED"
    assert info.value.__cause__ is not None


async def test_second_create_of_same_module_does_not_recompile(root: Path) -> None:
    async with await create_wasm_sandbox(wasm_module_path=FSPROBE, policy=policy(root)):
        pass
    before = _engine.compile_count()
    async with await create_wasm_sandbox(wasm_module_path=FSPROBE, policy=policy(root)):
        pass
    assert _engine.compile_count() == before


# -- host imports --------------------------------------------------------------------------


async def test_denied_secret_returns_acces_and_never_reaches_the_adapter(
    root: Path, wat: Callable[[str], Path]
) -> None:
    secrets = DictSecrets({"API_KEY": "k", "OTHER_KEY": "o"})
    async with await create_wasm_sandbox(
        wasm_module_path=wat(IMPORTS_WAT),
        policy=policy(root, secrets=[{"name": "API_KEY"}]),
        proxies=Adapters(secrets=secrets),
    ) as sb:
        assert await sb.call("secret", 16, 9) == Errno.ACCES
        assert secrets.requested == []
        assert await sb.call("secret", 0, 7) == Errno.SUCCESS
        assert secrets.requested == ["API_KEY"]
        assert await sb.call("load", 512) == 1
        assert [d.code for d in sb.denials] == ["SAND_PERM_DENIED"]


async def test_out_of_range_pointers_get_fault_never_an_exception(
    root: Path, wat: Callable[[str], Path]
) -> None:
    secrets = DictSecrets({"API_KEY": "k"})
    async with await create_wasm_sandbox(
        wasm_module_path=wat(IMPORTS_WAT),
        policy=policy(root, secrets=[{"name": "API_KEY"}]),
        proxies=Adapters(secrets=secrets),
    ) as sb:
        assert await sb.call("secret", 65530, 100) == Errno.FAULT
        assert await sb.call("secret", -1, 7) == Errno.FAULT
        assert await sb.call("secret_raw", 0, 7, 65535, 64, 0) == Errno.FAULT
        assert await sb.call("secret_raw", 0, 7, 256, 64, 65534) == Errno.FAULT
        assert await sb.call("secret_raw", 0, 7, 256, 0, 512) == Errno.NOBUFS
        assert await sb.call("load", 512) == 1


async def test_denied_connect_opens_no_socket_and_is_reported(
    root: Path, wat: Callable[[str], Path]
) -> None:
    fetch = FakeFetch()
    metrics = InMemoryMetrics()
    async with await create_wasm_sandbox(
        wasm_module_path=wat(IMPORTS_WAT),
        policy=policy(root, fetch=["api.stripe.com"]),
        proxies=Adapters(fetch=fetch),
        metrics=metrics,
    ) as sb:
        before = _sockets_open()
        with _sockets_made() as made:
            assert await sb.call("connect", 64, 16) == Errno.ACCES
            denied_made = made[0]
        assert denied_made == 0  # not even one created and closed again
        assert _sockets_open() == before
        assert fetch.connects == []
        assert [d.code for d in sb.denials] == ["SAND_WASM_OUTBOUND_DENIED"]
        assert (
            metrics.value(
                "plugin.permission_denied_total",
                plugin="guest",
                capability="fetch",
                reason="host-not-in-allowlist",
            )
            == 1
        )
        with _sockets_made() as made:
            assert await sb.call("connect", 32, 14) == Errno.SUCCESS
            allowed_made = made[0]
        assert allowed_made >= 1  # the count does see the adapter's socket
        assert fetch.connects == [("api.stripe.com", 443)]
        assert await sb.call("load", 520) == 3
    fetch.close()


# -- budgets -------------------------------------------------------------------------------


async def test_infinite_loop_ends_with_wall_clock_budget(root: Path) -> None:
    metrics = InMemoryMetrics()
    path = FIXTURES / "spin.wasm"
    budgets = {"wallClockMs": 50}
    async with await create_wasm_sandbox(
        wasm_module_path=path, policy=policy(root, budgets=budgets), metrics=metrics
    ) as sb:
        began = time.monotonic()
        with pytest.raises(SuaveplanError) as info:
            await sb.run(argv=["spin"])
        took = time.monotonic() - began
    # Within the budget plus one tick of the epoch ticker; the rest is scheduling slack for a
    # loaded machine (a guest that is never interrupted fails the test's own timeout).
    assert 0.050 <= took <= 0.050 + _engine.TICK_S + 0.25, took
    assert info.value.code == "BUDGET_EXCEEDED"
    assert info.value.details["budget"] == "wallClockMs"
    assert metrics.value("plugin.budget_exceeded_total", plugin="guest", budget="wallClockMs") == 1


async def test_wall_clock_budget_never_ends_a_guest_early(root: Path) -> None:
    # A budget of one tick: with the deadline counted in ticks from an arbitrary phase of the
    # ticker, a guest was stopped anywhere from 0 to 5 ms into a 5 ms budget (the CI failure
    # that 50 ms showed once). Every run must get at least its whole budget.
    path = FIXTURES / "spin.wasm"
    wall_ms = round(_engine.TICK_S * 1000)
    async with await create_wasm_sandbox(
        wasm_module_path=path, policy=policy(root, budgets={"wallClockMs": wall_ms})
    ) as first:
        del first  # the engine and its ticker are running before the runs below
    for _ in range(12):
        async with await create_wasm_sandbox(
            wasm_module_path=path, policy=policy(root, budgets={"wallClockMs": wall_ms})
        ) as sb:
            began = time.monotonic()
            with pytest.raises(SuaveplanError) as info:
                await sb.run(argv=["spin"])
            took = time.monotonic() - began
        assert info.value.details["budget"] == "wallClockMs"
        assert took >= wall_ms / 1000.0, took


async def test_memory_bomb_ends_with_memory_budget(root: Path) -> None:
    metrics = InMemoryMetrics()
    async with await create_wasm_sandbox(
        wasm_module_path=FIXTURES / "membomb.wasm",
        policy=policy(root, budgets={"memoryMb": 24}),
        metrics=metrics,
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.run(argv=["membomb"])
    assert info.value.details["budget"] == "memoryMb"
    assert metrics.value("plugin.budget_exceeded_total", plugin="guest", budget="memoryMb") == 1


async def test_wat_memory_bomb_trap_is_memory_budget(
    root: Path, wat: Callable[[str], Path]
) -> None:
    text = """(module (memory (export "memory") 1)
      (func (export "bomb")
        (block (loop (br_if 1 (i32.eq (memory.grow (i32.const 1)) (i32.const -1))) (br 0)))
        unreachable))"""
    metrics = InMemoryMetrics()
    async with await create_wasm_sandbox(
        wasm_module_path=wat(text), policy=policy(root, budgets={"memoryMb": 2}), metrics=metrics
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("bomb")
    assert info.value.code == "BUDGET_EXCEEDED"
    assert info.value.details["budget"] == "memoryMb"
    assert metrics.value("plugin.budget_exceeded_total", plugin="guest", budget="memoryMb") == 1


# -- dispose -------------------------------------------------------------------------------


async def test_dispose_closes_preopen_descriptors_and_is_idempotent(root: Path) -> None:
    before = _fds()
    sb = await create_wasm_sandbox(
        wasm_module_path=FSPROBE, policy=policy(root, fs=["./uploads/*", "./private/*"])
    )
    assert _fds() > before
    await sb.dispose()
    await sb.dispose()
    assert _fds() == before
    with pytest.raises(SuaveplanError) as info:
        await sb.run(argv=["fsprobe"])
    assert info.value.code == "SAND_WASM_DISPOSED"


async def test_unknown_export_is_coded(root: Path, wat: Callable[[str], Path]) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=wat(IMPORTS_WAT), policy=policy(root)
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("nope")
    assert info.value.code == "SAND_WASM_NO_SUCH_EXPORT"


DB_WAT = """
(module
  (import "suaveplan" "db_query"
    (func $q (param i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "SELECT 1")
  (func (export "query") (result i32)
    (call $q (i32.const 0) (i32.const 8) (i32.const 0) (i32.const 0)
      (i32.const 256) (i32.const 1024) (i32.const 2048))))
"""


async def test_dispose_cancels_an_in_flight_host_call(
    root: Path, wat: Callable[[str], Path]
) -> None:
    db = FakeDb(delay=3600)
    sb = await create_wasm_sandbox(
        wasm_module_path=wat(DB_WAT),
        policy=PermissionPolicy.from_manifest(
            {"name": "guest", "database": {"tablePrefix": "guest_"}}, root=root
        ),
        proxies=Adapters(db=db),
    )
    pending = asyncio.ensure_future(sb.call("query"))
    while not db.queries:
        await asyncio.sleep(0)
    await sb.dispose()
    assert await pending == Errno.CANCELED


async def test_disk_cache_serves_a_module_the_host_compiled_earlier(
    root: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    digest = hashlib.sha256(FSPROBE.read_bytes()).hexdigest()
    # The artefact is named by the bytes that were compiled: fsprobe has memory.grow, so
    # those are its instrumented rewrite (`_instrument`), not the file's own bytes.
    rewritten = instrument(FSPROBE.read_bytes())
    assert isinstance(rewritten, Instrumented)
    compiled = hashlib.sha256(rewritten.wasm).hexdigest()
    _engine._modules.pop(digest, None)
    async with await create_wasm_sandbox(
        wasm_module_path=FSPROBE, policy=policy(root), cache_dir=cache
    ):
        pass
    assert [p.name.startswith(compiled) for p in cache.iterdir()] == [True]
    _engine._modules.pop(digest, None)
    before = _engine.compile_count()
    async with await create_wasm_sandbox(
        wasm_module_path=FSPROBE, policy=policy(root), cache_dir=cache
    ) as sb:
        res = await sb.run(argv=["fsprobe", "echo", "-"], stdin=b"x")
    assert _engine.compile_count() == before
    assert res.stdout == b"x"
