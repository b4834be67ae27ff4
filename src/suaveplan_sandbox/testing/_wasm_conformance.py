"""`run_wasm_sandbox_conformance(label, make_sandbox)`: the WASM spec's scenarios as a harness.

`make_sandbox(**kwargs)` must accept the keyword arguments of `create_wasm_sandbox`
(`wasm_module_path`, `policy`, `proxies`, `metrics`) and return an awaitable sandbox. Works
without pytest; raises one `AssertionError` naming each failed scenario. `WASM_SCENARIOS`
lists them for per-item pytest parametrisation. Guests are WAT, compiled here.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Final

import wasmtime

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing._fakes import DictSecrets, FakeFetch
from suaveplan_sandbox.testing._scenarios import Scenario, run_scenarios

MakeSandbox = Callable[..., Awaitable[Any]]

_GUEST: Final = """
(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
  (import "suaveplan" "sock_connect" (func $sc (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "OTHER_KEY")
  (data (i32.const 32) "evil.example.com")
  (data (i32.const 64) "api.stripe.com")
  (data (i32.const 96) "new.txt")
  (data (i32.const 128) "../other/secret.txt")
  (data (i32.const 160) "link/secret.txt")
  (data (i32.const 192) "inside.txt")
  (func (export "secret_other") (result i32)
    (call $sg (i32.const 0) (i32.const 9) (i32.const 256) (i32.const 64) (i32.const 512)))
  (func (export "connect_evil") (result i32)
    (call $sc (i32.const 32) (i32.const 16) (i32.const 443) (i32.const 520)))
  (func (export "connect_stripe") (result i32)
    (call $sc (i32.const 64) (i32.const 14) (i32.const 443) (i32.const 520)))
  (func (export "create_in_preopen") (result i32)
    (call $open (i32.const 3) (i32.const 0) (i32.const 96) (i32.const 7) (i32.const 1)
      (i64.const 0x40) (i64.const 0) (i32.const 0) (i32.const 600)))
  (func (export "open_read") (param $path i32) (param $len i32) (param $follow i32) (result i32)
    (call $open (i32.const 3) (local.get $follow) (local.get $path) (local.get $len)
      (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 600)))
  (func (export "secret_at") (param $p i32) (param $l i32) (result i32)
    (call $sg (local.get $p) (local.get $l) (i32.const 256) (i32.const 64) (i32.const 512)))
  (func (export "bomb")
    (block (loop (br_if 1 (i32.eq (memory.grow (i32.const 1)) (i32.const -1))) (br 0)))
    unreachable)
  (func (export "spin") (loop (br 0)))
  (func (export "answer") (result i32) (i32.const 42))
  (func (export "echo") (param i32) (result i32) (local.get 0)))
"""
# cpuPercent: the wall-clock budget is a backstop so a host that ignores cpuPercent fails the
# scenario (wrong budget) instead of spinning forever; the await is bounded as well.
_CPU_PERCENT: Final = 20
_CPU_WALL_BACKSTOP_MS: Final = 20_000
_CPU_SCENARIO_TIMEOUT_S: Final = 40.0
_OLD_WASI: Final = (
    '(module (import "wasi_snapshot_preview0" "fd_write" '
    "(func (param i32 i32 i32 i32) (result i32))))"
)


def _policy(root: Path, **permissions: object) -> PermissionPolicy:
    extra: dict[str, object] = {}
    if "secrets" in permissions:
        extra["secrets"] = permissions.pop("secrets")
    manifest = {"name": "conformance", "permissions": permissions, **extra}
    return PermissionPolicy.from_manifest(manifest, root=root)


def _with_root(
    body: Callable[[MakeSandbox, Path], Coroutine[Any, Any, None]],
) -> Callable[[MakeSandbox], None]:
    def check(make: MakeSandbox) -> None:
        with tempfile.TemporaryDirectory(prefix="suaveplan-wasm-conf-") as tmp:
            root = Path(tmp)
            (root / "uploads").mkdir()
            (root / "other").mkdir()
            (root / "other" / "secret.txt").write_text("secret")
            (root / "uploads" / "link").symlink_to("../other")
            (root / "uploads" / "inside.txt").write_text("inside")
            (root / "guest.wasm").write_bytes(wasmtime.wat2wasm(_GUEST))
            (root / "old.wasm").write_bytes(wasmtime.wat2wasm(_OLD_WASI))
            asyncio.run(body(make, root))

    return check


async def _instantiation_honours_policy(make: MakeSandbox, root: Path) -> None:
    sb = await make(wasm_module_path=root / "guest.wasm", policy=_policy(root, fs=["./uploads/*"]))
    try:
        assert [p.guest for p in sb.preopens] == ["/uploads"], sb.preopens
        assert [p.host for p in sb.preopens] == [(root / "uploads").resolve()]
    finally:
        await sb.dispose()


async def _unsupported_wasi_rejected(make: MakeSandbox, root: Path) -> None:
    try:
        await make(wasm_module_path=root / "old.wasm", policy=_policy(root))
    except SuaveplanError as exc:
        assert exc.code == "SAND_WASM_WASI_VERSION_UNSUPPORTED", exc.code
    else:
        raise AssertionError("wasi_snapshot_preview0 was instantiated")


async def _read_only_by_default(make: MakeSandbox, root: Path) -> None:
    sb = await make(wasm_module_path=root / "guest.wasm", policy=_policy(root, fs=["./uploads/*"]))
    try:
        errno = await sb.call("create_in_preopen")
        assert errno != 0, "a write into a read-only preopen succeeded"
        assert not (root / "uploads" / "new.txt").exists()
    finally:
        await sb.dispose()


async def _rw_prefix_enables_write(make: MakeSandbox, root: Path) -> None:
    sb = await make(
        wasm_module_path=root / "guest.wasm", policy=_policy(root, fs=["rw:./uploads/*"])
    )
    try:
        assert await sb.call("create_in_preopen") == 0
        assert (root / "uploads" / "new.txt").exists()
    finally:
        await sb.dispose()


async def _preopen_refused_not_widened(make: MakeSandbox, root: Path) -> None:
    metrics = InMemoryMetrics()
    try:
        await make(
            wasm_module_path=root / "guest.wasm",
            policy=_policy(root, fs=["./uploads/a.txt"]),
            metrics=metrics,
        )
    except SuaveplanError as exc:
        assert exc.code == "SAND_WASM_PREOPEN_DENIED", exc.code
    else:
        raise AssertionError("a single-file rule was widened to a preopen")
    assert (
        metrics.value(
            "plugin.permission_denied_total",
            plugin="conformance",
            capability="fs",
            reason="path-not-in-allowlist",
        )
        == 1
    )


def _sockets() -> int:
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            count += str(fd.readlink()).startswith("socket:")
        except OSError:
            continue
    return count


async def _outbound_allowlist(make: MakeSandbox, root: Path) -> None:
    fetch, metrics = FakeFetch(), InMemoryMetrics()
    sb = await make(
        wasm_module_path=root / "guest.wasm",
        policy=_policy(root, fetch=["api.stripe.com"]),
        proxies=Adapters(fetch=fetch),
        metrics=metrics,
    )
    try:
        before = _sockets()
        assert await sb.call("connect_evil") == 2, "denied connect must return ACCES"
        assert _sockets() == before, "a denied connect created a socket"
        assert fetch.connects == []
        assert "SAND_WASM_OUTBOUND_DENIED" in [d.code for d in sb.denials]
        assert (
            metrics.value(
                "plugin.permission_denied_total",
                plugin="conformance",
                capability="fetch",
                reason="host-not-in-allowlist",
            )
            == 1
        )
        assert await sb.call("connect_stripe") == 0
        assert fetch.connects == [("api.stripe.com", 443)]
    finally:
        await sb.dispose()
        fetch.close()


async def _denied_import_never_reaches_adapter(make: MakeSandbox, root: Path) -> None:
    secrets = DictSecrets({"API_KEY": "k", "OTHER_KEY": "o"})
    sb = await make(
        wasm_module_path=root / "guest.wasm",
        policy=_policy(root, secrets=[{"name": "API_KEY"}]),
        proxies=Adapters(secrets=secrets),
    )
    try:
        assert await sb.call("secret_other") == 2
        assert secrets.requested == []
    finally:
        await sb.dispose()


async def _escapes_from_a_preopen_fail(make: MakeSandbox, root: Path) -> None:
    sb = await make(
        wasm_module_path=root / "guest.wasm", policy=_policy(root, fs=["rw:./uploads/*"])
    )
    try:
        # fd 3 is the only preopen (/uploads); `other/` sits beside it in the plugin root.
        assert await sb.call("open_read", 192, 10, 0) == 0, "a file inside could not be opened"
        assert await sb.call("open_read", 128, 19, 0) != 0, "`..` left the preopen"
        for follow in (0, 1):
            errno = await sb.call("open_read", 160, 15, follow)
            assert errno != 0, "a symlink inside the preopen reached a file outside it"
    finally:
        await sb.dispose()


async def _out_of_range_pointers_get_fault(make: MakeSandbox, root: Path) -> None:
    secrets = DictSecrets({"API_KEY": "k"})
    sb = await make(
        wasm_module_path=root / "guest.wasm",
        policy=_policy(root, secrets=[{"name": "API_KEY"}]),
        proxies=Adapters(secrets=secrets),
    )
    try:
        for ptr, length in [(65530, 100), (-1, 7), (0, -1), (2**31 - 1, 1)]:
            assert await sb.call("secret_at", ptr, length) == 21, (ptr, length)  # FAULT
        assert secrets.requested == [], "an out-of-range name reached the adapter"
        assert await sb.call("answer") == 42, "an out-of-range pointer broke the instance"
    finally:
        await sb.dispose()


async def _expect_breach(sb: Any, export: str, budget: str, what: str) -> None:
    """`export` must end with BUDGET_EXCEEDED for `budget`; `what` says what went wrong."""
    try:
        await asyncio.wait_for(sb.call(export), timeout=_CPU_SCENARIO_TIMEOUT_S)
    except SuaveplanError as exc:
        assert exc.code == "BUDGET_EXCEEDED", exc.code
        assert exc.details.get("budget") == budget, exc.details
    else:
        raise AssertionError(what)


async def _memory_bomb_ends_with_memory_budget(make: MakeSandbox, root: Path) -> None:
    metrics = InMemoryMetrics()
    sb = await make(
        wasm_module_path=root / "guest.wasm",
        policy=_policy(root, budgets={"memoryMb": 2}),
        metrics=metrics,
    )
    try:
        await _expect_breach(sb, "bomb", "memoryMb", "a guest growing without end returned")
        assert (
            metrics.value("plugin.budget_exceeded_total", plugin="conformance", budget="memoryMb")
            == 1
        ), "the memoryMb breach was not counted exactly once"
    finally:
        await sb.dispose()


def _fds() -> int:
    return sum(1 for _ in Path("/proc/self/fd").iterdir())


async def _dispose_closes_preopen_descriptors(make: MakeSandbox, root: Path) -> None:
    before = _fds()
    sb = await make(
        wasm_module_path=root / "guest.wasm", policy=_policy(root, fs=["./uploads/*", "./other/*"])
    )
    try:
        assert _fds() > before, "the preopens hold no descriptor (is the sandbox in-process?)"
    finally:
        await sb.dispose()
    assert _fds() == before, "dispose left preopen descriptors open"


async def _dispose_idempotent(make: MakeSandbox, root: Path) -> None:
    sb = await make(wasm_module_path=root / "guest.wasm", policy=_policy(root, fs=["./uploads/*"]))
    await sb.dispose()
    await sb.dispose()
    try:
        await sb.call("secret_other")
    except SuaveplanError as exc:
        assert exc.code == "SAND_WASM_DISPOSED", exc.code
    else:
        raise AssertionError("call after dispose succeeded")


async def _cpu_percent_ends_a_spinning_guest(make: MakeSandbox, root: Path) -> None:
    metrics = InMemoryMetrics()
    budgets = {"cpuPercent": _CPU_PERCENT, "wallClockMs": _CPU_WALL_BACKSTOP_MS}
    sb = await make(
        wasm_module_path=root / "guest.wasm",
        policy=_policy(root, budgets=budgets),
        metrics=metrics,
    )
    try:
        await _expect_breach(sb, "spin", "cpuPercent", "a guest spinning forever returned")

        def count(budget: str) -> float:
            return metrics.value(
                "plugin.budget_exceeded_total", plugin="conformance", budget=budget
            )

        assert count("cpuPercent") == 1, "the cpuPercent breach was not counted exactly once"
        assert count("wallClockMs") == 0, "the wall clock, not cpuPercent, ended the guest"
        # A breach ends the guest: the handle serves no more calls, and says why.
        try:
            await sb.call("answer")
        except SuaveplanError as exc:
            assert exc.code == "SAND_WASM_ENDED", exc.code
            assert exc.details.get("budget") == "cpuPercent", exc.details
        else:
            raise AssertionError("a call after a budget breach ran the ended guest")
    finally:
        await sb.dispose()


async def _breach_ends_the_guest(make: MakeSandbox, root: Path) -> None:
    metrics = InMemoryMetrics()
    sb = await make(
        wasm_module_path=root / "guest.wasm",
        policy=_policy(root, budgets={"wallClockMs": 100}),
        metrics=metrics,
    )
    try:
        await _expect_breach(sb, "spin", "wallClockMs", "a guest spinning forever returned")
        try:
            await sb.call("answer")
        except SuaveplanError as exc:
            assert exc.code == "SAND_WASM_ENDED", exc.code
        else:
            raise AssertionError("the guest kept serving after a budget breach")
        assert metrics.value("plugin.budget_exceeded_total") == 1, "breach not counted once"
    finally:
        await sb.dispose()
        await sb.dispose()


async def _ill_typed_arguments_refused(make: MakeSandbox, root: Path) -> None:
    sb = await make(wasm_module_path=root / "guest.wasm", policy=_policy(root))
    try:
        for args in [(1.5,), (2**40,), (True,), ("7",), (), (1, 2)]:
            try:
                await sb.call("echo", *args)
            except SuaveplanError as exc:
                assert exc.code == "SAND_INVALID_ARGUMENT", (args, exc.code)
            else:
                raise AssertionError(f"echo{args!r} was not refused")
        assert await sb.call("echo", 7) == 7, "a refused argument broke the instance"
    finally:
        await sb.dispose()


WASM_SCENARIOS: Final[tuple[Scenario[MakeSandbox], ...]] = (
    Scenario("instantiation honours the policy", _with_root(_instantiation_honours_policy)),
    Scenario("rejects unsupported WASI version", _with_root(_unsupported_wasi_rejected)),
    Scenario("read-only by default", _with_root(_read_only_by_default)),
    Scenario("rw prefix enables write", _with_root(_rw_prefix_enables_write)),
    Scenario("inexpressible rule refused, never widened", _with_root(_preopen_refused_not_widened)),
    Scenario("denied destination never opens a socket", _with_root(_outbound_allowlist)),
    Scenario(
        "denied capability import never reaches host adapter",
        _with_root(_denied_import_never_reaches_adapter),
    ),
    Scenario(
        "cpuPercent budget ends a spinning guest",
        _with_root(_cpu_percent_ends_a_spinning_guest),
    ),
    Scenario("a budget breach ends the guest", _with_root(_breach_ends_the_guest)),
    Scenario("a memory bomb ends with memoryMb", _with_root(_memory_bomb_ends_with_memory_budget)),
    Scenario("`..` and symlink escapes fail", _with_root(_escapes_from_a_preopen_fail)),
    Scenario("out-of-range pointers get FAULT", _with_root(_out_of_range_pointers_get_fault)),
    Scenario(
        "dispose closes every preopen descriptor",
        _with_root(_dispose_closes_preopen_descriptors),
    ),
    Scenario("ill-typed arguments are refused", _with_root(_ill_typed_arguments_refused)),
    Scenario("dispose is idempotent", _with_root(_dispose_idempotent)),
)


def run_wasm_sandbox_conformance(label: str, make_sandbox: MakeSandbox) -> int:
    """Run every WASM scenario against `make_sandbox`; returns the number run."""
    return run_scenarios(label, WASM_SCENARIOS, make_sandbox)
