"""`create_wasm_sandbox`: a WASI preview 1 module under wasmtime with policy-derived preopens.

Theory of operation. Lifecycle table:

| state    | call/run                      | dispose            |
|----------|-------------------------------|--------------------|
| ready    | runs guest in worker → ready  | → disposed         |
| running  | serialised behind a lock      | cancels host calls |
| disposed | SAND_WASM_DISPOSED            | no-op              |

The guest runs in a per-sandbox worker thread so host imports can block: each `suaveplan.*`
import calls `gateway.dispatch_sync(...)` on the guest thread — the same admission, audit
and metrics as `dispatch`, there is no second permission path — and only an async adapter
is awaited on the event loop (`run_coroutine_threadsafe`). `dispose()` closes the
gateway (in-flight adapter calls are cancelled and later imports get `CANCELED`), drops the
store, instance and sockets, and closes the preopen descriptors by dropping the store.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import socket
import tempfile
import threading
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

import wasmtime

from suaveplan_sandbox.adapters._protocols import Adapters, AuditRecord, AuditSink
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.metrics import BUDGET_EXCEEDED, InMemoryMetrics, MetricsSink
from suaveplan_sandbox.permissions import (
    BudgetTracker,
    Deny,
    DenyReason,
    PermissionChecker,
    PermissionPolicy,
)
from suaveplan_sandbox.permissions._clock import Clock
from suaveplan_sandbox.wasm import _engine
from suaveplan_sandbox.wasm._cpu import CallWatch, CpuWatcher

_NO_DEADLINE: Final = 1 << 62
_PAGE: Final = 65536
_I32: Final = wasmtime.ValType.i32()


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PreopenSpec:
    """One WASI preopen: host directory, guest path, writable."""

    host: Path
    guest: str
    writable: bool


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


def _rule_directory(rule: str) -> tuple[str | None, bool]:
    """(root-relative directory or None, writable) for one fs rule — fallback derivation."""
    writable = rule.startswith("rw:")
    text = rule[3:] if writable else rule
    while text.startswith("./"):
        text = text[2:]
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if parts and parts[-1] == "*":
        parts = parts[:-1]
        if not any("*" in p for p in parts):
            return "/".join(parts) or ".", writable
        return None, writable
    return None, writable


def preopens_for(policy: PermissionPolicy) -> list[tuple[str, str | None, bool]]:
    """(rule, directory-or-None, writable) for every fs rule of the policy."""
    fs = policy.fs
    getter = getattr(fs, "preopens", None)
    if callable(getter):
        return [(str(p.rule), p.directory, bool(p.writable)) for p in getter()]
    out = []
    for rule in policy.fs_rules:
        directory, writable = _rule_directory(rule)
        out.append((rule, directory, writable))
    return out


def resolve_preopens(policy: PermissionPolicy, checker: PermissionChecker) -> list[PreopenSpec]:
    """Preopens from the policy; a rule that is not a directory preopen refuses creation.

    The refusal counts `plugin.permission_denied_total{capability="fs",
    reason="path-not-in-allowlist"}`: the rule grants something a preopen cannot express
    without widening, so the request for that preopen is outside what can be allowed.
    """
    rules = preopens_for(policy)
    if not rules:
        return []  # nothing to resolve: skips the root's realpath on every create
    root = policy.root.resolve()
    specs: list[PreopenSpec] = []
    for rule, directory, writable in rules:
        host = (root / directory).resolve() if directory is not None else None
        if host is None or not host.is_dir() or not host.is_relative_to(root):
            checker.deny("fs", DenyReason.PATH_NOT_IN_ALLOWLIST)
            raise SuaveplanError(
                "SAND_WASM_PREOPEN_DENIED",
                "an fs rule cannot be expressed as a WASI preopen without widening it",
                {"capability": "fs", "rule": rule},
            )
        guest = "/" if directory in (".", "") else "/" + str(directory)
        specs.append(PreopenSpec(host=host, guest=guest, writable=writable))
    return specs


# The sandbox whose guest is running on this thread (each sandbox runs its guest on its own
# worker thread); the shared linker's host imports find their sandbox here.
_current = threading.local()
_linker_lock = threading.Lock()
_linkers: dict[int, wasmtime.Linker] = {}


def _current_sandbox() -> WasmSandbox:
    sb = getattr(_current, "sb", None)
    if not isinstance(sb, WasmSandbox):
        raise SuaveplanError("SAND_CANCELLED", "no sandbox is running on this thread")
    return sb


def _shared_linker(eng: wasmtime.Engine) -> wasmtime.Linker:
    from suaveplan_sandbox.wasm._imports import define

    with _linker_lock:
        linker = _linkers.get(id(eng))
        if linker is None:
            linker = wasmtime.Linker(eng)
            linker.define_wasi()
            define(linker, _current_sandbox)
            _linkers[id(eng)] = linker
        return linker


# Module -> its imports resolved once against the shared linker (wasmtime's InstancePre), so
# a create does no import resolution. A module that fails to link is not remembered.
_pres: weakref.WeakKeyDictionary[wasmtime.Module, wasmtime.InstancePre] = (
    weakref.WeakKeyDictionary()
)


def _instance_pre(module: wasmtime.Module) -> wasmtime.InstancePre:
    with _linker_lock:
        pre = _pres.get(module)
    if pre is not None:
        return pre
    try:
        pre = _shared_linker(_engine.engine()).instantiate_pre(module)
    except wasmtime.WasmtimeError as exc:
        raise _engine.translate(exc, during="instantiate") from exc
    with _linker_lock:
        return _pres.setdefault(module, pre)


@final
class WasmSandbox:
    """A handle on one instantiated module. Use `async with` or call `dispose()`."""

    def __init__(
        self,
        *,
        module: wasmtime.Module,
        imports_wasi: bool = True,
        policy: PermissionPolicy,
        gateway: Gateway,
        preopens: Sequence[PreopenSpec],
        metrics: MetricsSink,
        loop: asyncio.AbstractEventLoop,
        denials: list[SuaveplanError],
    ) -> None:
        self._module = module
        self._pre = _instance_pre(module)
        self._imports_wasi = imports_wasi
        self._policy = policy
        self._gateway = gateway
        self._preopens = tuple(preopens)
        self._metrics = metrics
        self._loop = loop
        self._denials = denials
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._sockets: dict[int, socket.socket] = {}
        self._next_fd = 3
        self._disposed = False
        self._store: wasmtime.Store | None = None
        self._instance: wasmtime.Instance | None = None
        # The long-lived instance's exports, read on the first call (not at create).
        self._exports: Mapping[str, object] | None = None
        # The running guest's exported `memory`, for host imports (saves a lookup per import).
        # Only set while a guest of this store runs: it must never meet another store.
        self._guest_memory: wasmtime.Memory | None = None
        # cpuPercent: thread CPU time sampled by an epoch callback on the guest thread.
        self._cpu = CpuWatcher() if policy.budgets.cpu_percent is not None else None
        self._store, self._instance = self._instantiate(argv=(), stdin=None, out=None, err=None)

    # -- public ----------------------------------------------------------------------------

    @property
    def denials(self) -> tuple[SuaveplanError, ...]:
        return tuple(self._denials)

    @property
    def preopens(self) -> tuple[PreopenSpec, ...]:
        return self._preopens

    @property
    def disposed(self) -> bool:
        return self._disposed

    async def call(self, export: str, *args: int | float) -> Any:
        self._check_alive()
        return await self._loop.run_in_executor(self._worker(), self._call_sync, export, args)

    async def run(self, *, argv: Sequence[str] = (), stdin: bytes = b"") -> RunResult:
        self._check_alive()
        return await self._loop.run_in_executor(self._worker(), self._run_sync, tuple(argv), stdin)

    async def dispose(self) -> None:
        if self._disposed:
            return
        self._disposed = True
        await self._gateway.close()
        self._release()

    def dispose_nowait(self) -> None:
        if self._disposed:
            return
        self._disposed = True
        self._gateway.close_nowait()
        self._release()

    async def __aenter__(self) -> WasmSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.dispose()

    # -- internals -------------------------------------------------------------------------

    def _worker(self) -> concurrent.futures.ThreadPoolExecutor:
        # Created on first use: most of a create's cost would otherwise be this pool.
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="suaveplan-wasm"
            )
        return self._executor

    def _release(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        # No lock: a running guest holds it, and it may be waiting on this very loop for a
        # host call that gateway.close() just cancelled. The running call keeps its own
        # references to store and instance until it unwinds; later calls see `disposed`.
        self._store = None
        self._instance = None
        self._exports = None
        sockets, self._sockets = self._sockets, {}
        for sock in sockets.values():
            sock.close()

    def _check_alive(self) -> None:
        if self._disposed:
            raise SuaveplanError("SAND_WASM_DISPOSED", "the sandbox was disposed")

    def _instantiate(
        self,
        *,
        argv: Sequence[str],
        stdin: str | None,
        out: Callable[[bytes], None] | None,
        err: Callable[[bytes], None] | None,
    ) -> tuple[wasmtime.Store, wasmtime.Instance]:
        store = wasmtime.Store(_engine.engine())
        if self._imports_wasi:
            # Nothing is inherited: argv/env/stdio are only what the host passes (a fresh
            # WasiConfig has no argv, env, stdio or preopens). A module that imports no WASI
            # gets no WASI context at all.
            wasi = wasmtime.WasiConfig()
            if argv:
                wasi.argv = list(argv)
            if stdin is not None:
                wasi.stdin_file = stdin
            if out is not None:
                wasi.stdout_custom = out
            if err is not None:
                wasi.stderr_custom = err
            for p in self._preopens:
                wasi.preopen_dir(str(p.host), p.guest, p.writable)
            store.set_wasi(wasi)
        limit = self._policy.budgets.memory_mb
        if limit is not None:
            store.set_limits(memory_size=limit * 1024 * 1024)
        store.set_epoch_deadline(_NO_DEADLINE)
        if self._cpu is not None:
            self._cpu.install(store)
        previous = getattr(_current, "sb", None)
        _current.sb = self
        try:
            instance = self._pre.instantiate(store)
        except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
            raise _engine.translate(exc, during="instantiate") from exc
        finally:
            _current.sb = previous
        return store, instance

    def _arm_deadline(self, store: wasmtime.Store) -> CallWatch | None:
        wall = self._policy.budgets.wall_clock_ms
        if self._cpu is not None:
            # The callback judges CPU and wall clock on every tick; see `_cpu`.
            tracker = BudgetTracker(
                self._policy.budgets, plugin=self._gateway.plugin, metrics=self._metrics
            )
            watch = CallWatch(tracker, wall)
            self._cpu.watch = watch
            store.set_epoch_deadline(1)
            return watch
        if wall is None:
            store.set_epoch_deadline(_NO_DEADLINE)
        else:
            store.set_epoch_deadline(max(1, math.ceil(wall / 1000.0 / _engine.TICK_S)))
        return None

    def _disarm(self) -> None:
        if self._cpu is not None:
            self._cpu.watch = None

    def _call_sync(self, export: str, args: tuple[int | float, ...]) -> Any:
        with self._lock:
            self._check_alive()
            store, instance = self._store, self._instance
            assert store is not None and instance is not None
            exports = self._exports
            if exports is None:
                exports = self._exports = instance.exports(store)
            func = exports.get(export)
            if not isinstance(func, wasmtime.Func):
                raise SuaveplanError(
                    "SAND_WASM_NO_SUCH_EXPORT", "no such exported function", {"export": export}
                )
            memory = exports.get("memory")
            watch = self._arm_deadline(store)
            _current.sb = self
            self._guest_memory = memory if isinstance(memory, wasmtime.Memory) else None
            try:
                return func(store, *args)
            except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
                raise self._guest_failure(exc, store, instance, watch) from exc
            finally:
                _current.sb = None
                self._guest_memory = None
                self._disarm()

    def _run_sync(self, argv: tuple[str, ...], stdin: bytes) -> RunResult:
        out, err = bytearray(), bytearray()
        with self._lock, tempfile.NamedTemporaryFile(prefix="suaveplan-stdin-") as fh:
            self._check_alive()
            fh.write(stdin)
            fh.flush()
            store, instance = self._instantiate(
                argv=argv, stdin=fh.name, out=out.extend, err=err.extend
            )
            exports = instance.exports(store)
            start = exports.get("_start")
            if not isinstance(start, wasmtime.Func):
                raise SuaveplanError(
                    "SAND_WASM_NO_SUCH_EXPORT", "no such exported function", {"export": "_start"}
                )
            memory = exports.get("memory")
            watch = self._arm_deadline(store)
            code = 0
            _current.sb = self
            self._guest_memory = memory if isinstance(memory, wasmtime.Memory) else None
            try:
                start(store)
            except wasmtime.ExitTrap as exc:
                code = exc.code
                if code != 0 and self._at_memory_limit(store, instance):
                    raise self._budget("memoryMb", self._policy.budgets.memory_mb) from exc
            except (wasmtime.WasmtimeError, wasmtime.Trap) as exc:
                raise self._guest_failure(exc, store, instance, watch) from exc
            finally:
                _current.sb = None
                self._guest_memory = None
                self._disarm()
                del store, instance, exports, memory
            return RunResult(exit_code=code, stdout=bytes(out), stderr=bytes(err))

    def _guest_failure(
        self,
        exc: BaseException,
        store: wasmtime.Store,
        instance: wasmtime.Instance,
        watch: CallWatch | None = None,
    ) -> SuaveplanError:
        if watch is not None:
            if watch.error is not None:
                return watch.error  # BudgetTracker already counted it
            if watch.wall_exceeded:
                return self._budget("wallClockMs", self._policy.budgets.wall_clock_ms)
        code = exc.trap_code if isinstance(exc, wasmtime.Trap) else None
        if code == wasmtime.TrapCode.INTERRUPT:
            return self._budget("wallClockMs", self._policy.budgets.wall_clock_ms)
        if self._at_memory_limit(store, instance):
            return self._budget("memoryMb", self._policy.budgets.memory_mb)
        return _engine.translate(exc, during="call")

    def _at_memory_limit(self, store: wasmtime.Store, instance: wasmtime.Instance) -> bool:
        # wasmtime-py exposes no resource-limiter callback, so a refused `memory.grow` is
        # inferred: a guest that failed (trap or non-zero exit) with less than one page of
        # headroom under `memoryMb` hit the limit.
        limit = self._policy.budgets.memory_mb
        if limit is None:
            return False
        mem = instance.exports(store).get("memory")
        return isinstance(mem, wasmtime.Memory) and (
            mem.data_len(store) + _PAGE > limit * 1024 * 1024
        )

    def _budget(self, budget: str, limit: float | None) -> SuaveplanError:
        self._metrics.inc(BUDGET_EXCEEDED.name, {"plugin": self._gateway.plugin, "budget": budget})
        return SuaveplanError(
            "BUDGET_EXCEEDED", f"budget exceeded: {budget}", {"budget": budget, "limit": limit}
        )

    # -- host imports ------------------------------------------------------------------------

    def _dispatch(self, capability: str, operation: str, args: dict[str, object]) -> object:
        """Gateway call from the guest thread. Raises SuaveplanError.

        The decision (and a synchronous adapter) runs right here on the guest thread; only an
        async adapter makes the guest wait for the event loop.
        """
        if self._disposed or self._gateway.closed:
            raise SuaveplanError("SAND_CANCELLED", "the sandbox was disposed")
        return self._gateway.dispatch_sync(capability, operation, args, run_coroutine=self._on_loop)

    def _on_loop(self, coro: Coroutine[Any, Any, object]) -> object:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            # A start function runs during create, on the loop's own thread: blocking on the
            # loop here would deadlock it. Fail closed; sync adapters still work there.
            coro.close()
            raise SuaveplanError(
                "SAND_ADAPTER_FAILED",
                "an async adapter cannot be awaited while the module is being instantiated",
            )
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:  # the loop is closed: the host is gone
            coro.close()
            raise SuaveplanError("SAND_CANCELLED", "the sandbox was disposed") from None
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            raise SuaveplanError("SAND_CANCELLED", "the sandbox was disposed") from None


async def create_wasm_sandbox(
    *,
    wasm_module_path: str | Path,
    policy: PermissionPolicy,
    proxies: Adapters | None = None,
    plugin_name: str | None = None,
    metrics: MetricsSink | None = None,
    clock: Clock | None = None,
    audit: AuditSink | None = None,
    cache_dir: str | Path | None = None,
) -> WasmSandbox:
    """Compile (cached) and instantiate the module under `policy`. See docs/wasm-abi.md."""
    sink: MetricsSink = metrics if metrics is not None else InMemoryMetrics()
    checker = PermissionChecker(policy, plugin=plugin_name, metrics=sink)
    module = _engine.load_module_file(
        wasm_module_path, cache_dir=Path(cache_dir) if cache_dir is not None else None
    )
    imports_wasi = _engine.check_imports(module)
    preopens = resolve_preopens(policy, checker)
    denials: list[SuaveplanError] = []

    def on_denial(deny: Deny, cap: str, op: str) -> None:
        if cap == "fetch" and op == "connect":
            denials.append(
                SuaveplanError(
                    "SAND_WASM_OUTBOUND_DENIED",
                    "outbound connect denied",
                    {"capability": "fetch", "reason": deny.reason.value},
                )
            )
            if audit is not None:
                # The gateway's own record says `deny:SAND_PERM_DENIED`; this one names the
                # host-level outcome the guest's connect surfaced as.
                audit.record(
                    AuditRecord(
                        plugin=checker.plugin,
                        capability="fetch",
                        operation="connect",
                        allowed=False,
                        reason=deny.reason.value,
                        rule=None,
                        duration_ms=0.0,
                        outcome="deny:SAND_WASM_OUTBOUND_DENIED",
                    )
                )
        else:
            denials.append(deny.to_error())

    gateway = Gateway(
        checker=checker,
        adapters=proxies or Adapters(),
        audit=audit,
        clock=clock,
        on_denial=on_denial,
    )
    return WasmSandbox(
        module=module,
        imports_wasi=imports_wasi,
        policy=policy,
        gateway=gateway,
        preopens=preopens,
        metrics=sink,
        loop=asyncio.get_running_loop(),
        denials=denials,
    )
