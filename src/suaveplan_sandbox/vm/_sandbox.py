"""`VmSandbox`: one hardened worker process per sandbox, served over a socketpair.

Theory of operation: `create_vm_sandbox` checks the plugin on the host (`load_plugin`),
asks the fork server for a worker and waits for `Ready`. A dedicated `loop.add_reader`
callback decodes worker frames: results resolve the pending call; host calls run through the
Gateway as tasks and are answered; anything else kills the worker. Calls are serialised per
sandbox (the worker is single-threaded); while one runs, a watchdog samples the worker's CPU
and RSS and the call's wall clock through the `BudgetTracker`.

Lifecycle (state, event) -> state; any unexpected exception moves to CRASHED:

    STARTING  --ready-->        IDLE
    STARTING  --eof/bad frame-> CRASHED
    IDLE      --call-->         CALLING
    CALLING   --result-->       IDLE
    CALLING   --budget breach-> CRASHED (call raises BUDGET_EXCEEDED)
    IDLE|CALLING --eof/bad frame--> CRASHED (call raises SAND_VM_WORKER_CRASHED)
    any       --dispose-->      DISPOSED (terminal; use raises SAND_VM_DISPOSED)
    CRASHED   --dispose-->      DISPOSED
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import signal
import socket
import threading
from collections.abc import Coroutine
from typing import Any, Final, TypeVar, final

import psutil

from suaveplan_sandbox.adapters import Adapters, BeneathRootFs
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.metrics import InMemoryMetrics, MetricsSink
from suaveplan_sandbox.permissions import (
    BudgetTracker,
    Clock,
    Deny,
    PermissionChecker,
    PermissionPolicy,
    budget_error,
)
from suaveplan_sandbox.protocol import (
    NEED_DATA,
    Call,
    Event,
    Failure,
    FrameDecoder,
    HostCall,
    HostFailure,
    HostReply,
    Log,
    Message,
    ProtocolError,
    Ready,
    Result,
    encode,
)
from suaveplan_sandbox.vm._guest import load_plugin
from suaveplan_sandbox.vm._hardening import HardeningReport
from suaveplan_sandbox.vm._worker_loop import PROBE_CALL
from suaveplan_sandbox.vm._zygote import fork_server

_log = logging.getLogger("suaveplan_sandbox.vm")
_T = TypeVar("_T")

# RLIMIT_AS is virtual memory; the interpreter maps far more than it touches.
INTERPRETER_SLACK_BYTES: Final = 512 * 1024 * 1024
SAMPLE_INTERVAL_S: Final = 0.02
DEFAULT_MAX_FRAME_BYTES: Final = 16 * 1024 * 1024


# Codes only the host may produce: a worker claiming one is lying (a plugin can construct any
# SuaveplanError), so its failure is re-coded as the plugin's own error.
HOST_ONLY_CODES: Final = frozenset(
    {
        "BUDGET_EXCEEDED",
        "SAND_VM_WORKER_CRASHED",
        "SAND_VM_FORK_SERVER_FAILED",
        "SAND_VM_DISPOSED",
        "SAND_VM_HARDENING_UNAVAILABLE",
    }
)


def _recode_guest_error(err: SuaveplanError) -> SuaveplanError:
    if err.code not in HOST_ONLY_CODES:
        return err
    return SuaveplanError(
        "SAND_VM_PLUGIN_ERROR",
        "the plugin raised an error with a host-reserved code",
        {"type": "SuaveplanError", "claimed_code": err.code},
    )


class _State(enum.Enum):
    STARTING = "starting"
    IDLE = "idle"
    CALLING = "calling"
    CRASHED = "crashed"
    DISPOSED = "disposed"


_S = _State
_TRANSITIONS: Final[dict[tuple[_State, str], _State]] = {
    (_S.STARTING, "ready"): _S.IDLE,
    (_S.STARTING, "crash"): _S.CRASHED,
    (_S.IDLE, "call"): _S.CALLING,
    (_S.CALLING, "result"): _S.IDLE,
    (_S.IDLE, "crash"): _S.CRASHED,
    (_S.CALLING, "crash"): _S.CRASHED,
    (_S.CRASHED, "crash"): _S.CRASHED,
    **{(s, "dispose"): _S.DISPOSED for s in _State},
}


def _crashed(why: str) -> SuaveplanError:
    return SuaveplanError("SAND_VM_WORKER_CRASHED", "the worker process died", {"why": why})


@final
class VmSandbox:
    """A plugin running in its own hardened worker. Create with `create_vm_sandbox`."""

    def __init__(self, *, _token: object) -> None:
        if _token is not _PRIVATE:
            raise TypeError("use create_vm_sandbox()")
        self._state = _S.STARTING
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder(max_frame_bytes=DEFAULT_MAX_FRAME_BYTES)
        self._pid = 0
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._ready: asyncio.Future[Ready] = self._loop.create_future()
        self._call_lock = asyncio.Lock()
        self._host_tasks: set[asyncio.Task[None]] = set()
        self._fatal: SuaveplanError | None = None
        self._hardening: HardeningReport | None = None
        self.denials: list[Deny] = []
        self.logs: list[tuple[str, str]] = []
        self._gateway: Gateway
        self._tracker: BudgetTracker
        self._metrics: MetricsSink
        self._plugin = ""
        self._budget_watch = False
        self._proc: psutil.Process | None = None
        self._subscriptions: list[str] = []
        self._owned_fs: BeneathRootFs | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def _move(self, event: str) -> None:
        nxt = _TRANSITIONS.get((self._state, event))
        if nxt is None:
            raise _crashed(f"unexpected {event} in {self._state.value}")
        self._state = nxt

    @property
    def state(self) -> str:
        return self._state.value

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def hardening(self) -> HardeningReport:
        assert self._hardening is not None
        return self._hardening

    @property
    def subscriptions(self) -> list[str]:
        return list(self._subscriptions)

    async def __aenter__(self) -> VmSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.dispose()

    def _kill(self) -> None:
        if self._pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)

    def _close_sock(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None

    def _crash(self, err: SuaveplanError, *, count: bool = True) -> None:
        if self._state in (_S.CRASHED, _S.DISPOSED):
            return
        self._state = _S.CRASHED
        self._fatal = err
        if count and err.code in ("SAND_VM_WORKER_CRASHED", "SAND_WIRE_ERROR"):
            cause = str(err.details.get("why", "unknown")).split(":", 1)[0]
            with contextlib.suppress(Exception):
                self._metrics.inc(
                    "plugin.worker_crashed_total", {"plugin": self._plugin, "cause": cause}
                )
        self._kill()
        self._close_sock()
        self._gateway.close_nowait()
        if not self._ready.done():
            self._ready.set_exception(err)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()

    async def dispose(self) -> None:
        """Kill the worker, cancel in-flight adapter calls, close fds. Idempotent."""
        if self._state is _S.DISPOSED:
            return
        self._state = _S.DISPOSED
        self._kill()
        self._close_sock()
        err = SuaveplanError("SAND_VM_DISPOSED", "the sandbox was disposed")
        if not self._ready.done():
            self._ready.set_exception(err)
            self._ready.exception()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()
        await self._gateway.close()
        for task in list(self._host_tasks):
            task.cancel()
        if self._owned_fs is not None:
            self._owned_fs.close()
            self._owned_fs = None

    # -- channel --------------------------------------------------------------------------
    def _send(self, msg: Message) -> None:
        assert self._sock is not None
        try:
            self._sock.sendall(encode(msg))
        except OSError as exc:
            self._crash(_crashed("send"))
            raise self._fatal or _crashed("send") from exc

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            data = sock.recv(262144)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        self._on_readable_data(data)

    def _on_readable_data(self, data: bytes) -> None:
        if not data:
            self._crash(_crashed("eof"))
            return
        try:
            self._decoder.receive_data(data)
            while (msg := self._decoder.next_message()) is not NEED_DATA:
                self._handle(msg)
        except ProtocolError as exc:
            self._crash(_crashed(f"wire:{exc.details.get('reason')}"))
        except SuaveplanError as exc:
            self._crash(exc)
        except Exception:  # lifecycle rule: anything unexpected is terminal
            _log.exception("worker channel failed for plugin %s", self._plugin)
            self._crash(_crashed("host-error"))

    def _handle(self, msg: Message) -> None:
        if isinstance(msg, Result | Failure):
            fut = self._pending.pop(msg.id, None)
            if fut is None:
                if isinstance(msg, Failure) and msg.id == 0 and not self._ready.done():
                    self._ready.set_exception(SuaveplanError.from_wire(msg.error))
                    return
                raise _crashed("unexpected-reply")
            if isinstance(msg, Result):
                fut.set_result(msg.value)
            else:
                fut.set_exception(_recode_guest_error(SuaveplanError.from_wire(msg.error)))
        elif isinstance(msg, HostCall):
            if self._state is not _S.CALLING:
                raise _crashed("hostcall-outside-call")
            task = self._loop.create_task(self._serve_host_call(msg))
            self._host_tasks.add(task)
            task.add_done_callback(self._host_tasks.discard)
        elif isinstance(msg, Log):
            self.logs.append((msg.level, msg.text))
            _log.log(logging.getLevelName(msg.level.upper()), "[%s] %s", self._plugin, msg.text)
        elif isinstance(msg, Ready) and not self._ready.done():
            self._ready.set_result(msg)
        else:
            raise _crashed("out-of-protocol")

    async def _serve_host_call(self, msg: HostCall) -> None:
        try:
            value = await self._gateway.dispatch(msg.capability, msg.operation, msg.args)
            reply: Message = HostReply(id=msg.id, value=value)
        except SuaveplanError as exc:
            reply = HostFailure(id=msg.id, error=exc.to_wire())  # type: ignore[arg-type]
        except asyncio.CancelledError:
            return
        if self._sock is not None and self._state is _S.CALLING:
            try:
                self._sock.sendall(encode(reply))
            except (OSError, ProtocolError):
                self._crash(_crashed("send"))

    async def _event(self, topic: str, payload: object) -> None:
        if self._sock is not None and self._state in (_S.IDLE, _S.CALLING):
            self._sock.sendall(encode(Event(topic=topic, payload=payload)))

    # -- budgets --------------------------------------------------------------------------
    async def _watch(self) -> None:
        proc = self._proc
        assert proc is not None
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL_S)
            try:
                self._tracker.tick()
                with proc.oneshot():
                    times = proc.cpu_times()
                    rss = proc.memory_info().rss
                self._tracker.sample_cpu(times.user + times.system)
                self._tracker.sample_memory(rss)
            except SuaveplanError as exc:
                self._crash(exc, count=False)
                return
            except psutil.Error:
                return

    # -- calls ----------------------------------------------------------------------------
    async def call(self, name: str, *args: object, **kwargs: object) -> object:
        """Call the plugin's public top-level function `name`; returns its plain-data result."""
        async with self._call_lock:
            return await self._call(name, list(args), kwargs)

    async def _call(self, name: str, args: list[object], kwargs: dict[str, object]) -> object:
        if self._state is _S.DISPOSED:
            raise SuaveplanError("SAND_VM_DISPOSED", "the sandbox was disposed")
        if self._state is _S.CRASHED:
            assert self._fatal is not None
            raise _crashed("earlier-crash") from self._fatal
        self._move("call")
        self._next_id += 1
        call_id = self._next_id
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._pending[call_id] = fut
        watch: asyncio.Task[None] | None = None
        self._tracker.start_call()
        try:
            self._send(Call(id=call_id, name=name, args=args, kwargs=dict(kwargs)))
            if self._budget_watch:
                watch = self._loop.create_task(self._watch())
            try:
                value = await fut
            except SuaveplanError as exc:
                if (
                    exc.code == "SAND_VM_PLUGIN_ERROR"
                    and exc.details.get("type") == "MemoryError"
                    and self._tracker.budgets.memory_mb is not None
                ):
                    limit = self._tracker.budgets.memory_mb
                    err = budget_error("memoryMb", limit=limit, observed=limit)
                    self._metrics.inc(
                        "plugin.budget_exceeded_total",
                        {"plugin": self._plugin, "budget": "memoryMb"},
                    )
                    self._crash(err, count=False)
                    raise err from None
                raise
            return value
        finally:
            if self._state is _S.CALLING:
                self._move("result")
            self._tracker.end_call()
            if watch is not None:
                watch.cancel()
            self._pending.pop(call_id, None)

    async def _process_probe(self) -> object:
        """Test-only: raw OS calls inside the hardened worker (requires the probe flag)."""
        return await self.call(PROBE_CALL)

    # -- blocking facade ------------------------------------------------------------------
    @staticmethod
    def blocking(**kwargs: Any) -> BlockingVmSandbox:
        """A synchronous handle: the sandbox lives on a private event loop in a thread."""
        return BlockingVmSandbox(**kwargs)


_PRIVATE: Final = object()


async def create_vm_sandbox(
    *,
    plugin_module_path: str | os.PathLike[str],
    policy: PermissionPolicy,
    proxies: Adapters | None = None,
    plugin_name: str | None = None,
    metrics: MetricsSink | None = None,
    clock: Clock | None = None,
    audit: Any = None,
    require_hardening: tuple[str, ...] | list[str] = (),
    _test_process_probe: bool = False,
) -> VmSandbox:
    """Check the plugin, fork a hardened worker for it and wait until it is ready."""
    bundle = load_plugin(plugin_module_path)
    sb = VmSandbox(_token=_PRIVATE)
    sb._plugin = plugin_name or policy.plugin
    sb._metrics = metrics if metrics is not None else InMemoryMetrics()
    checker = PermissionChecker(policy, plugin=sb._plugin, metrics=sb._metrics)
    if proxies is None:
        sb._owned_fs = _default_fs(policy)
        adapters = Adapters(fs=sb._owned_fs)
    else:
        adapters = proxies
    sb._gateway = Gateway(
        checker=checker,
        adapters=adapters,
        audit=audit,
        clock=clock,
        on_denial=lambda deny, _cap, _op: sb.denials.append(deny),
    )
    budgets = policy.budgets
    sb._tracker = BudgetTracker(budgets, plugin=sb._plugin, metrics=sb._metrics, clock=clock)
    sb._budget_watch = any(
        v is not None for v in (budgets.wall_clock_ms, budgets.memory_mb, budgets.cpu_percent)
    )
    mem = budgets.memory_mb
    rlimits = (int(mem * 1024 * 1024) + INTERPRETER_SLACK_BYTES if mem is not None else None, None)
    host_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sb._pid = fork_server().fork(
                bundle,
                worker_end,
                rlimits=rlimits,
                require=tuple(require_hardening),
                probe=_test_process_probe,
            )
        finally:
            worker_end.close()
        sb._sock = host_end
        sb._loop.add_reader(host_end.fileno(), sb._on_readable)
        with contextlib.suppress(psutil.Error):
            sb._proc = psutil.Process(sb._pid)
        ready = await sb._ready
        sb._hardening = HardeningReport.from_wire(ready.hardening)
        sb._subscriptions = list(ready.subscriptions)
        sb._move("ready")
    except BaseException:
        if sb._sock is None:
            host_end.close()
        await sb.dispose()
        raise
    for topic in sb._subscriptions:
        await sb._gateway.dispatch("events", "subscribe", {"topic": topic}, handler=sb._event)
    return sb


def _default_fs(policy: PermissionPolicy) -> BeneathRootFs | None:
    """The fs adapter a sandbox owns when the host gave no proxies: beneath the policy root."""
    if not policy.fs_rules:
        return None
    return BeneathRootFs(policy.root)


@final
class BlockingVmSandbox:
    """Blocking facade over `VmSandbox`: a private event loop runs in a daemon thread."""

    def __init__(self, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        try:
            self._sandbox: VmSandbox = self._run(create_vm_sandbox(**kwargs))
        except BaseException:
            self._stop()
            raise
        self._closed = False

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @property
    def hardening(self) -> HardeningReport:
        return self._sandbox.hardening

    @property
    def denials(self) -> list[Deny]:
        return self._sandbox.denials

    def call(self, name: str, *args: object, **kwargs: object) -> object:
        if self._closed:
            raise SuaveplanError("SAND_VM_DISPOSED", "the sandbox was disposed")
        return self._run(self._sandbox.call(name, *args, **kwargs))

    def dispose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._run(self._sandbox.dispose())
        self._stop()

    def __enter__(self) -> BlockingVmSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()


def create_vm_sandbox_sync(**kwargs: Any) -> BlockingVmSandbox:
    """Blocking `create_vm_sandbox` for scripts."""
    return BlockingVmSandbox(**kwargs)
