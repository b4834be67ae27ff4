"""`VmSandbox`: one hardened worker process per sandbox, served over a socketpair.

Theory of operation: `create_vm_sandbox` loads the plugin (`load_plugin`: it reads the
sources, never parses them, and has the fork server check and compile them in a limited
child unless it holds them already), asks the fork server for a worker and waits for
`Ready`. The worker is single-threaded, so
the host runs one *job* at a time — a plugin call or an event delivery — and queues the rest
in FIFO order. A `loop.add_reader` callback decodes worker frames and resolves the job's
future directly; the next queued job is sent from the same callback, so a call costs one
future and no task. Host calls made during a job go through `Gateway.dispatch_eager` from the
same callback: answered inline when it completes there (a synchronous adapter, or a
coroutine adapter that never suspends, in its eagerly started task), otherwise
when the gateway's task for it is done; replies are bound to that job (a reply never
reaches a later job) and dispose cancels the tasks still running. Budgets cost nothing
per call unless set, and little when set: the wall clock is one timer that outlives jobs
(a job records its deadline; the timer, when it fires, looks at the job then running and
re-arms for its deadline, or lapses when none is), CPU and RSS a sampling timer that
fires every `SAMPLE_INTERVAL_S` while a job is in flight (plus a sample at a job's end when
one is due, so calls shorter than the interval cannot hide CPU) and every
`IDLE_SAMPLE_INTERVAL_S` between jobs (a worker that escaped the interpreter can spend both
after it answered). Neither is created or cancelled per call; the sampler changes cadence
when a job begins after an idle sample was armed. Every sandbox, with budgets or without,
has the idle cadence: its samples are also the idle watchdog (`_watch_idle`), which ends a
worker spending CPU while no job is in flight (`cpu-while-idle`), and the one-thread
watchdog (`_watch_threads`), which ends one whose CPU time grew faster than the wall clock,
job or not (`cpu-beyond-one-thread`: an honest worker has a single thread); without a CPU or
RSS budget the sampler keeps that cadence through jobs too, so calls never touch it. Writes are
non-blocking with a bounded buffer: a worker that stops reading cannot stall the host's loop,
and never raise SIGPIPE.
Reads go into one receive buffer per thread. A worker sends nothing between its answer and
the next job: a byte that arrives then ends it (`data-outside-call`).

What a plugin can make the host hold or emit is bounded. Log lines: `logs` keeps the most
recent (`MAX_RECORDED_LOGS` lines, `MAX_RECORDED_LOG_CHARS` characters), `logs_total`
counts all; at most `log_lines_per_s` a second (a burst of as many) reach the host's
`logging`, each cut to `MAX_FORWARDED_LOG_CHARS` with control characters escaped, and the
lines held back are reported, with their count, in one warning when the allowance returns
(or at dispose). Events: an event published while a sandbox serves an event delivery is one
hop deeper than that delivery (a context variable set around the host call carries the
depth through the bus, across sandboxes and threads); a delivery deeper than
`MAX_EVENT_DEPTH` is dropped, as is one that finds `MAX_QUEUED_EVENTS` deliveries (or
`MAX_QUEUED_EVENT_BYTES` of them) already waiting for the worker. Drops (`events_dropped`)
and failed deliveries (`events_failed`) are reported in warnings of at most one a second,
each with its count. A plugin subscribes to at most `MAX_SUBSCRIPTIONS` topics. Host calls:
a worker sends one at a time (the honest one waits for each answer), so one sent before the
last was answered ends the worker (`hostcall-overlap`), and a capability name the host does
not know reaches the gateway, its metrics and audit as `unknown`.

Busy polling (`busy_poll_us`, 200 by default, 0 turns it off): after sending the worker
something it answers (a call, an event, a host call's reply) the host keeps its loop from
sleeping for up to that long, by re-queueing one cheap callback, so the loop polls its
selector without blocking and the answer is read as soon as it arrives instead of after a
wake-up from `epoll_wait` (the largest single cost of a round trip on this machine). Other
callbacks and I/O run as usual meanwhile. It is adaptive: a sandbox keeps polling only
while the last answer came within the window, so a slow plugin or adapter costs one window,
then one in every `REPROBE_EVERY + 1` answers (`AdaptivePoll`). The worker polls the same
way (see `_worker_loop`), except under a `cpuPercent` budget, where polling would bill the
plugin for time it spends waiting. And when no other sandbox of the loop has a job in
flight, `call` skips the loop altogether: it reads the worker's frames itself right after
sending, serving host calls the gateway completes there, and returns without a turn of the
loop (`_begin_inline`; its bounds, and why the loop stays responsive, in `_inline_wait`).
The polling itself is `poll_receiver`'s, in C where the accelerator is built.

Lifecycle (state, event) -> state; any unexpected exception moves to CRASHED:

    STARTING  --ready-->        IDLE
    STARTING  --eof/bad frame-> CRASHED
    IDLE      --call-->         CALLING   (a call or an event delivery is sent)
    CALLING   --result-->       IDLE      (then the next queued job, if any, is sent)
    CALLING   --budget breach-> CRASHED (the job raises BUDGET_EXCEEDED)
    IDLE|CALLING --eof/bad frame--> CRASHED (jobs raise SAND_VM_WORKER_CRASHED)
    any       --dispose-->      DISPOSED (terminal; use raises SAND_VM_DISPOSED)
    CRASHED   --dispose-->      DISPOSED
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from time import monotonic
from typing import Any, Final, final

import psutil

from suaveplan_sandbox._create_arguments import (
    bad_argument,
    check_common_create_arguments,
    check_path_argument,
    check_unused_with_proxies,
)
from suaveplan_sandbox._loop_thread import LoopThread
from suaveplan_sandbox._printable import printable
from suaveplan_sandbox.adapters import Adapters, StandardAdapters, open_standard_adapters
from suaveplan_sandbox.adapters import _events as _bus
from suaveplan_sandbox.adapters._protocols import EventHandler, QueryResult
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.errors._failure_log import log_failure
from suaveplan_sandbox.errors._redact import SecretRedactor
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.metrics import (
    EVENTS_DROPPED,
    LOG_LINES_SUPPRESSED,
    InMemoryMetrics,
    MetricsSink,
)
from suaveplan_sandbox.permissions import (
    BudgetTracker,
    Clock,
    Deny,
    DenyReason,
    PermissionChecker,
    PermissionPolicy,
    _accel,
    budget_error,
)
from suaveplan_sandbox.permissions._topic_rules import topic_matches
from suaveplan_sandbox.protocol import (
    NEED_DATA,
    Call,
    Event,
    Failure,
    FrameDecoder,
    Hardened,
    HostCall,
    HostFailure,
    HostReply,
    Log,
    Message,
    ProtocolError,
    Ready,
    Result,
    encode,
    encode_fields,
)
from suaveplan_sandbox.vm._guest import load_plugin
from suaveplan_sandbox.vm._guest._runtime import MAX_SUBSCRIPTIONS
from suaveplan_sandbox.vm._hardening import LAYERS, HardeningReport, cpu_backstop_seconds
from suaveplan_sandbox.vm._inline_wait import INLINE_WAIT_US, MAX_HOLD_S, loop_share
from suaveplan_sandbox.vm._worker_loop import (
    DEFAULT_BUSY_POLL_US,
    MAX_BUSY_POLL_US,
    PROBE_CALL,
    AdaptivePoll,
    poll_receiver,
)
from suaveplan_sandbox.vm._zygote import fork_server

_log = logging.getLogger("suaveplan_sandbox.vm")
# Operator-enabled (DEBUG): scrubbed traceback text of the host's own unexpected failures.
_trace_log = logging.getLogger("suaveplan_sandbox.vm.traceback")

# RLIMIT_AS is virtual memory; the interpreter maps far more than it touches.
INTERPRETER_SLACK_BYTES: Final = 512 * 1024 * 1024
SAMPLE_INTERVAL_S: Final = 0.02
# Between jobs the sampler looks less often: what it guards against there is a worker that
# escaped the interpreter spending CPU or memory once it has answered (`_sample_idle`). One
# /proc read a second per idle sandbox (every sandbox: the idle watchdog, `_watch_idle`,
# runs with or without budgets); a breach is seen within about two intervals (the
# cpuPercent window is 1 s).
IDLE_SAMPLE_INTERVAL_S: Final = 1.0
# CPU seconds a worker may spend over one idle stretch, counted from the stretch's first idle
# sample (`_watch_idle`); more ends it (`cpu-while-idle`). An honest worker spends nothing
# there: it is single-threaded and blocked in `recv` once its busy poll (at most
# `busy_poll_us`, 200 us by default, 10 ms at the maximum) has ended, and that poll follows
# the answer, before the stretch's first sample in all but a race. Measured: 0.00 s over
# idle stretches of seconds after hundreds of polling calls
# (`tests/vm/host/test_idle_cpu_watchdog.py`). /proc reports CPU in 10 ms clock ticks, so a
# reading can be one tick off: 0.1 s is ten ticks and ten maximal busy-poll windows (500 of
# the default), and still lets a worker spinning threads on every core only a tenth of a
# core-second per stretch.
IDLE_CPU_LIMIT_S: Final = 0.1
# CPU seconds a worker may spend beyond the wall-clock time that passed, over the span the
# one-thread watchdog judges (`_watch_threads`); more ends it (`cpu-beyond-one-thread`). An
# honest worker has one thread (the guest has no API that makes one), so its CPU time grows no
# faster than the wall clock, busy or idle; only the readings err. /proc gives CPU in 10 ms
# clock ticks, user and system truncated apart (up to 20 ms under, each reading), and a
# running thread's time can lag by one scheduler tick (at most 10 ms); the wall span is taken
# from the clock read before the span's first /proc read to the one after its last, so a host
# descheduled around a read only lengthens it. The worst honest excess is thus about 40 ms:
# 0.1 s is ten ticks and 10% of `IDLE_SAMPLE_INTERVAL_S`, and lets a worker running threads
# on every core keep at most one core and a tenth of a second per span.
THREAD_CPU_MARGIN_S: Final = 0.1
# The loop may run a timer up to its clock resolution early; a deadline timer firing within
# this much of the job's deadline is that job's (the deadline sits 1 ms past the budget).
_EARLY_S: Final = 1e-4
DEFAULT_MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
# A worker that stops reading while the host has this much queued for it is killed.
MAX_OUTBOUND_BYTES: Final = 4 * DEFAULT_MAX_FRAME_BYTES
# Array items and map keys and values in one worker frame (see `FrameDecoder`): a frame
# decodes to at most about 70 bytes an element, not the 1.2 GB a 16 MiB frame of empty
# arrays used to cost the host (and seconds of its loop).
MAX_FRAME_ELEMENTS: Final = DEFAULT_MAX_FRAME_BYTES // 8
# With a wallClockMs budget, the worker must report ready (hardening applied, the plugin's
# module code run) within the budget plus this; a worker that stalls is killed.
START_GRACE_S: Final = 10.0
_RECV_BYTES: Final = 262144
# Worker frames handled in one turn of the loop; a read's others wait for the next turns,
# and nothing more is read meanwhile. A host call the gateway answers at once costs ~50 us
# (a denial, a synchronous adapter), and one read can hold thousands of small frames: a
# worker keeping its socket full held the loop every sandbox shares for half a second a
# read. 64 of the dearest take ~3 ms; an honest worker rarely has more than one waiting.
MAX_FRAMES_PER_TURN: Final = 64
# Every write to a worker: a worker that closed its socket (or died) under a reply must cost
# the host an EPIPE, never a SIGPIPE, whose default action ends the process (the state an
# embedded interpreter starts in, and one many programs restore).
_NOSIGNAL: Final = getattr(socket, "MSG_NOSIGNAL", 0)
# RLIMIT_CPU backstop per call (seconds of CPU) when the manifest sets no wallClockMs budget:
# generous enough for any honest call, finite so a runaway worker ends even if the host's
# loop is stuck. With wallClockMs it is `cpu_backstop_seconds(wallClockMs)` (budget + 1 s).
DEFAULT_CPU_BACKSTOP_S: Final = 300
# `VmSandbox.denials` keeps this many of the most recent denials; `denials_total` counts all.
MAX_RECORDED_DENIALS: Final = 256
# `VmSandbox.logs` keeps the most recent plugin log lines, at most this many and this many
# characters in all (a line is up to 64 KiB: 256 of them would hold 16 MiB per sandbox);
# `logs_total` counts every line.
MAX_RECORDED_LOGS: Final = 256
MAX_RECORDED_LOG_CHARS: Final = 1024 * 1024
# Plugin log lines reaching the host's `logging`: at most this many a second per sandbox by
# default (`create_vm_sandbox(log_lines_per_s=...)`, a burst of as many), each cut to
# MAX_FORWARDED_LOG_CHARS characters; a plugin cannot flood the host's log pipeline.
DEFAULT_LOG_LINES_PER_S: Final = 100
MAX_FORWARDED_LOG_CHARS: Final = 4096
# An event published while a sandbox handles an event is one hop deeper; deliveries deeper
# than `MAX_EVENT_DEPTH` are dropped (a subscriber re-publishing to its own topic, two plugins
# answering each other). A host's own publish starts at depth 1. The limit and the hop count
# (`_event_depth`) live with the buses, which carry the count (Redis: in the message).
MAX_EVENT_DEPTH: Final = _bus.MAX_EVENT_DEPTH
# Event deliveries one sandbox holds waiting for its worker, by count and by encoded bytes;
# more are dropped. Calls are not counted: how fast the host calls is the host's choice.
MAX_QUEUED_EVENTS: Final = 1024
MAX_QUEUED_EVENT_BYTES: Final = 64 * 1024 * 1024
# Warnings about one sandbox's dropped or failed event deliveries: at most one a second (the
# rest are counted in the next one, or in the one dispose writes).
_EVENT_WARNINGS_PER_S: Final = 1
_LOG_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
# The hop count of the event delivery whose host call is being served (0: a plugin call or
# the host itself). Set around an `events` host call; the bus's handlers run in (a copy of)
# that context, or a cross-process bus sets it from the message, so a delivery it causes
# knows how deep it is, on any sandbox, thread or host.
_event_depth: Final = _bus.event_depth


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
# Codes the host produces for a request the worker made: genuine only if the gateway really
# answered a request of this job that way.
_DENIED: Final = "SAND_PERM_DENIED"
# Gateway operations no VM guest makes and whose answer cannot cross the VM channel:
# `fetch.connect` returns a connected socket (the WASM guests' raw TCP). A worker that forged
# one had the host dial the granted host, fail to encode the socket and leave the connection
# to the garbage collector, as often as it liked. The gateway sees such a request under an
# operation it does not know and denies it (`malformed-payload`, counted and audited as any
# denial): nothing is dialled.
_NOT_ON_THE_VM_WIRE: Final = frozenset({("fetch", "connect")})
_UNKNOWN_OPERATION: Final = "unknown"


class _RecvBuffer(threading.local):
    """One receive buffer per thread, shared by its loop's sandboxes: a fresh `recv(n)` of a
    large `n` costs a malloc (an mmap/mremap/munmap triplet once the size passes glibc's
    threshold) per read, several times the syscall. The decoder copies what it is given
    before any message is handled, so the next read may reuse the buffer."""

    def __init__(self) -> None:
        self.buf = bytearray(_RECV_BYTES)
        self.view = memoryview(self.buf)


_recv_buffer = _RecvBuffer()


@final
class _Allowance:
    """A token bucket: `per_s` a second, holding at most `per_s` (at least one); None is
    unlimited, 0 allows nothing. `held` counts what was refused since `release_held`."""

    __slots__ = ("_last", "_per_s", "_tokens", "held")

    def __init__(self, per_s: int | None, now: float) -> None:
        self._per_s = per_s
        self._tokens = float(per_s or 0)
        self._last = now
        self.held = 0

    def take(self, now: float) -> bool:
        per_s = self._per_s
        if per_s is None:
            return True
        tokens = min(float(max(per_s, 1)), self._tokens + (now - self._last) * per_s)
        self._last = now
        if tokens >= 1.0:
            self._tokens = tokens - 1.0
            return True
        self._tokens = tokens
        return False

    def release_held(self) -> int:
        held, self.held = self.held, 0
        return held


def _claimed(code: str) -> SuaveplanError:
    return SuaveplanError(
        "SAND_VM_PLUGIN_ERROR",
        "the plugin raised an error with a host-reserved code",
        {"type": "SuaveplanError", "claimed_code": code},
    )


def _recode_guest_error(
    err: SuaveplanError, denials: frozenset[tuple[str, str]] = frozenset()
) -> SuaveplanError:
    """A worker-reported error as the host will believe it.

    Host-only codes are always re-coded. A permission denial is believed only if the gateway
    denied a request of the same job with the same capability and reason.
    """
    if err.code in HOST_ONLY_CODES:
        return _claimed(err.code)
    if err.code == _DENIED:
        key = (str(err.details.get("capability")), str(err.details.get("reason")))
        if key not in denials:
            return _claimed(err.code)
    return err


class _State:
    """Lifecycle states. Plain strings, not an enum: the table is consulted twice per call and
    an enum member hashes in Python code."""

    STARTING: Final = "starting"
    IDLE: Final = "idle"
    CALLING: Final = "calling"
    CRASHED: Final = "crashed"
    DISPOSED: Final = "disposed"
    ALL: Final = (STARTING, IDLE, CALLING, CRASHED, DISPOSED)


_S = _State
_TRANSITIONS: Final[dict[tuple[str, str], str]] = {
    (_S.STARTING, "ready"): _S.IDLE,
    (_S.STARTING, "crash"): _S.CRASHED,
    (_S.IDLE, "call"): _S.CALLING,
    (_S.CALLING, "result"): _S.IDLE,
    (_S.IDLE, "crash"): _S.CRASHED,
    (_S.CALLING, "crash"): _S.CRASHED,
    (_S.CRASHED, "crash"): _S.CRASHED,
    **{(s, "dispose"): _S.DISPOSED for s in _State.ALL},
}


def _startup_error(wire: dict[str, object], *, hardened: bool) -> SuaveplanError:
    """The worker's report that it could not start, as the host will believe it: a missing
    hardening layer is the worker's own finding only before its `Hardened` report (no plugin
    code has run yet); any other host-only code, or a denial (no request can be made before
    the plugin is ready), came from plugin code and is re-coded."""
    err = SuaveplanError.from_wire(wire)
    if err.code == "SAND_VM_HARDENING_UNAVAILABLE" and not hardened:
        return err
    return _recode_guest_error(err)


def _crashed(why: str) -> SuaveplanError:
    return SuaveplanError("SAND_VM_WORKER_CRASHED", "the worker process died", {"why": why})


_CONTAINERS: Final = (list, tuple, dict)


def _call_frame(
    call_id: int, name: object, args: tuple[object, ...], kwargs: dict[str, object]
) -> bytes:
    """The `Call` frame, or `SAND_INVALID_ARGUMENT` for what the caller passed that the
    worker could not take. The encoder refuses what msgpack cannot carry (and anything
    nested deeper than its limit, cycles included); a dict key that is not a str it would
    encode, and the worker's decoder (which takes str keys only) would break on it and end
    the worker: those are looked for here, in what was encoded, only when an argument is a
    container (never for the common scalar call)."""
    try:
        frame = encode_fields(Call, call_id, name, list(args), kwargs)
    except ProtocolError as exc:
        reason = str(exc.details.get("reason", "unencodable"))
        raise SuaveplanError(
            "SAND_INVALID_ARGUMENT",
            "the call's arguments are not plain data that fits one frame",
            {"argument": "args", "reason": reason},
        ) from exc
    except (TypeError, ValueError) as exc:  # the Call message's own field rules: the name
        raise SuaveplanError(
            "SAND_INVALID_ARGUMENT",
            "the function name must be a str of 1 to 256 characters",
            {"argument": "name", "type": type(name).__name__},
        ) from exc
    values = [*args, *kwargs.values()] if args or kwargs else []
    if any(isinstance(v, _CONTAINERS) for v in values) and _has_non_str_key(values):
        raise SuaveplanError(
            "SAND_INVALID_ARGUMENT",
            "a dict in the call's arguments has a key that is not a str",
            {"argument": "args", "reason": "non-str-key"},
        )
    return frame


def _has_non_str_key(values: list[object]) -> bool:
    """Whether a dict anywhere in `values` (encoded already: finite, no cycle) has a key
    that is not a str."""
    stack = [v for v in values if isinstance(v, _CONTAINERS)]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if type(key) is not str:
                    return True
                if isinstance(item, _CONTAINERS):
                    stack.append(item)
        else:
            assert isinstance(value, list | tuple)
            stack.extend(item for item in value if isinstance(item, _CONTAINERS))
    return False


# How long `dispose()` awaited on another loop waits for the sandbox's own loop to run it.
_ELSEWHERE_WAIT_S: Final = 5.0


@final
class _Remains:
    """What a sandbox holds that would outlive it: the worker (killed once: SIGKILL cannot be
    caught, and a later kill, a dispose long after a crash, could reach another process that
    was given the reaped worker's pid), the lifeline's write end (a raw descriptor) and the
    socket. `dispose` and a crash release them; a sandbox collected without either releases
    them through its finalizer, which holds this object, never the sandbox."""

    __slots__ = ("killed", "lifeline", "pid", "sock")

    def __init__(self) -> None:
        self.pid = 0
        self.killed = False
        self.lifeline = -1
        self.sock: socket.socket | None = None

    def kill(self) -> None:
        if self.pid and not self.killed:
            self.killed = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def close_lifeline(self) -> None:
        if self.lifeline >= 0:
            fd, self.lifeline = self.lifeline, -1
            with contextlib.suppress(OSError):
                os.close(fd)

    def release(self) -> None:
        self.kill()
        self.close_lifeline()
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()


def _interrupted(exc: BaseException) -> Exception:
    """What the worker is told of an adapter that raised `exc`, not an `Exception`: an
    adapter failure (`_host_failure` logs its type and a correlation id)."""
    return RuntimeError(f"the adapter raised {type(exc).__name__}")


def _sampling_unavailable(exc: psutil.Error, *, budgets: bool = True) -> SuaveplanError:
    """A worker whose CPU time and RSS cannot be read is not watched: its CPU/RSS budget
    (`budget-sampling`), or without one the idle watchdog (`idle-watchdog`), would go
    unenforced. Fail closed."""
    if budgets:
        layer, what = "budget-sampling", "its cpuPercent/memoryMb budget"
    else:
        layer, what = "idle-watchdog", "its CPU while idle"
    return SuaveplanError(
        "SAND_VM_HARDENING_UNAVAILABLE",
        f"the worker's CPU time and RSS cannot be read, so {what} cannot be enforced",
        {"layer": layer, "why": type(exc).__name__},
    )


def _sampled_process(pid: int, *, budgets: bool) -> psutil.Process:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        raise _crashed("exited-during-create") from None
    except psutil.Error as exc:
        raise _sampling_unavailable(exc, budgets=budgets) from None


def _cpu_seconds(proc: psutil.Process) -> float | None:
    """The worker's CPU seconds, all threads, user and system; None once it is gone (its
    socket's EOF ends the sandbox). Raises `psutil.Error` when it is there but unreadable."""
    try:
        times = proc.cpu_times()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    return float(times.user + times.system)


def _never_polled(buf: bytearray, deadline: float) -> int:
    raise AssertionError("polled before the channel was set up")


@dataclass(eq=False, slots=True)
class _Job:
    """One unit of worker time: a plugin call (`fut` set) or an event delivery (`fut` None)."""

    id: int
    frame: bytes
    fut: asyncio.Future[Any] | None
    topic: str = ""
    # (capability, reason) of every request the gateway denied during this job.
    denials: frozenset[tuple[str, str]] = frozenset()
    depth: int = 0  # an event delivery's hop count (0 for a call)
    awaiting_host: bool = False  # a host call of this job is not answered yet


@final
class VmSandbox:
    """A plugin running in its own hardened worker. Create with `create_vm_sandbox`."""

    def __init__(self, *, _token: object) -> None:
        if _token is not _PRIVATE:
            raise TypeError("use create_vm_sandbox()")
        self._state: str = _S.STARTING
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._fd = -1
        # The worker's pid and lifeline, and the socket: released by dispose or a crash, or
        # by `_finalizer` if the sandbox is collected without either (`_Remains`).
        self._remains = _Remains()
        self._finalizer = weakref.finalize(self, self._remains.release)
        self._decoder = FrameDecoder(
            max_frame_bytes=DEFAULT_MAX_FRAME_BYTES, max_elements=MAX_FRAME_ELEMENTS
        )
        # The gateway's record of the secret values it handed out (set with the gateway).
        self._redactor = SecretRedactor()
        self._out = bytearray()
        self._job: _Job | None = None
        self._waiting: deque[_Job] = deque()
        self._next_id = 0
        self._ready: asyncio.Future[Ready] = self._loop.create_future()
        self._host_tasks: set[asyncio.Task[None]] = set()
        self._fatal: SuaveplanError | None = None
        self._hardening: HardeningReport | None = None
        self._denials: deque[Deny] = deque(maxlen=MAX_RECORDED_DENIALS)
        self.denials_total = 0
        self._logs: deque[tuple[str, str]] = deque()
        self._log_chars = 0
        self.logs_total = 0
        self.logs_suppressed = 0
        self._log_allowance = _Allowance(DEFAULT_LOG_LINES_PER_S, 0.0)
        self._log_rate: int | None = DEFAULT_LOG_LINES_PER_S
        self._now = self._loop.time
        self.events_delivered = 0
        self.events_denied = 0
        self.events_dropped = 0
        self.events_failed = 0
        self._event_allowance = _Allowance(_EVENT_WARNINGS_PER_S, 0.0)
        # (outcome, reason) -> deliveries not yet reported: ("dropped", "event-depth"), ...
        self._events_held: dict[tuple[str, str], int] = {}
        self._queued_events = 0
        self._queued_event_bytes = 0
        self._gateway: Gateway
        self._tracker: BudgetTracker
        self._metrics: MetricsSink
        self._plugin = ""
        self._wall_s: float | None = None
        self._sampling = False
        self._next_sample = 0.0
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_at = 0.0  # loop time at which the current job's wall budget ends
        self._sampler: asyncio.TimerHandle | None = None
        self._sampler_idle = False  # `_sampler` runs at the idle cadence (`_sample_idle`)
        self._proc: psutil.Process | None = None
        # The idle watchdog (`_watch_idle`): the worker's CPU seconds at the first idle sample
        # of the current idle stretch (None: no stretch begun), the job count then, the CPU
        # the last budget sample read, and how many idle samples the watchdog has judged.
        self._idle_cpu: float | None = None
        self._idle_mark = 0
        self._cpu_s = 0.0
        self.idle_checks = 0
        # The one-thread watchdog (`_watch_threads`): the reading its span starts from and the
        # newer one that starts the next span, each (loop time before the read, CPU seconds);
        # and how many spans it has judged.
        self._span_from: tuple[float, float] | None = None
        self._span_next = (0.0, 0.0)
        self.thread_checks = 0
        self._subscriptions: list[str] = []
        self._owned: StandardAdapters | None = None
        self._poll = AdaptivePoll(0.0)
        self._worker_poll_us = 0
        self._sent_at = 0.0  # loop time the worker was last sent something it answers
        self._answered = True  # the worker has answered since
        self._hot: asyncio.Handle | None = None  # keeps the loop polling while it is set
        self._share = loop_share(self._loop)
        self._poll_recv: Callable[[bytearray, float], int] = _never_polled
        self._inline = False  # `call` is reading the worker's frames itself (`_begin_inline`)
        # The turn that handles the next slice of a read's frames (`_handle_slice`).
        self._backlog: asyncio.Handle | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def _move(self, event: str) -> None:
        nxt = _TRANSITIONS.get((self._state, event))
        if nxt is None:
            raise _crashed(f"unexpected {event} in {self._state}")
        self._state = nxt

    @property
    def state(self) -> str:
        return self._state

    @property
    def pid(self) -> int:
        return self._remains.pid

    @property
    def _lifeline(self) -> int:
        """The lifeline's write end (-1 once closed)."""
        return self._remains.lifeline

    @property
    def hardening(self) -> HardeningReport:
        assert self._hardening is not None
        return self._hardening

    @property
    def busy_poll_us(self) -> dict[str, int]:
        """How long each side polls for an answer before it blocks, in microseconds: the
        host's loop and the worker (0 under a `cpuPercent` budget, or when turned off)."""
        return {"host": round(self._poll.window_s * 1e6), "worker": self._worker_poll_us}

    @property
    def subscriptions(self) -> list[str]:
        return list(self._subscriptions)

    @property
    def denials(self) -> list[Deny]:
        """The most recent `MAX_RECORDED_DENIALS` denials, oldest first (a copy); every
        denial, also the dropped ones, is counted in `denials_total`."""
        return list(self._denials)

    def _record_denial(self, deny: Deny) -> None:
        self._denials.append(deny)
        self.denials_total += 1

    @property
    def logs(self) -> list[tuple[str, str]]:
        """The most recent plugin log lines as `(level, text)`, oldest first (a copy): at most
        `MAX_RECORDED_LOGS` lines and `MAX_RECORDED_LOG_CHARS` characters. Every line, also
        the dropped ones, is counted in `logs_total`; `logs_suppressed` counts those the
        host's `logging` was spared (over `log_lines_per_s`)."""
        return list(self._logs)

    async def __aenter__(self) -> VmSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.dispose()

    def _kill(self) -> None:
        self._remains.kill()

    def _close_sock(self) -> None:
        self._remains.close_lifeline()
        self._remains.sock = None
        if self._sock is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._fd)
            with contextlib.suppress(Exception):
                self._loop.remove_writer(self._fd)
            self._sock.close()
            self._sock = None
            self._out.clear()
        if self._backlog is not None:
            self._backlog.cancel()
            self._backlog = None

    def _stop_timers(self) -> None:
        if self._hot is not None:
            self._hot.cancel()
            self._hot = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._sampler is not None:
            self._sampler.cancel()
            self._sampler = None

    def _fail_jobs(self, err: SuaveplanError) -> None:
        """The job in flight fails with `err`; queued ones, never sent, as after a crash."""
        current, waiting = self._job, list(self._waiting)
        if current is not None:
            self._share.busy -= 1
        self._job = None
        self._waiting.clear()
        self._queued_events = self._queued_event_bytes = 0
        if current is not None and current.fut is not None and not current.fut.done():
            current.fut.set_exception(err)
        for job in waiting:
            if job.fut is not None and not job.fut.done():
                if err.code == "SAND_VM_DISPOSED":
                    job.fut.set_exception(err)
                else:
                    later = _crashed("earlier-crash")
                    later.__cause__ = err
                    job.fut.set_exception(later)

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
        self._stop_timers()
        self._tracker.end_call()
        self._gateway.close_nowait()
        if not self._ready.done():
            self._ready.set_exception(err)
        self._fail_jobs(err)

    async def dispose(self) -> None:
        """Kill the worker, cancel in-flight adapter calls, close fds. Idempotent.

        Awaited on an event loop other than the sandbox's own, the work is done on its own
        loop (`_dispose_elsewhere`)."""
        if self._state is _S.DISPOSED:
            return
        if asyncio.get_running_loop() is not self._loop:
            await self._dispose_elsewhere()
            return
        self._state = _S.DISPOSED
        self._kill()
        self._close_sock()
        self._stop_timers()
        self._report_held_logs()
        self._report_events()
        err = SuaveplanError("SAND_VM_DISPOSED", "the sandbox was disposed")
        if not self._ready.done():
            self._ready.set_exception(err)
            self._ready.exception()
        self._fail_jobs(err)
        await self._gateway.close()
        for task in list(self._host_tasks):
            task.cancel()
        if self._owned is not None:
            owned, self._owned = self._owned, None
            await owned.aclose()

    async def _dispose_elsewhere(self) -> None:
        """`dispose()` from another loop. The socket's reader, the timers, the futures and
        the adapter tasks are the sandbox loop's, and touching them from another thread
        races that loop: the dispose runs there and this waits for it. A loop that does not
        turn within `_ELSEWHERE_WAIT_S` (stopped, or blocked) cannot be waited for: the worker
        is killed from here, and the rest runs when that loop turns again. A closed loop runs
        nothing again: what needs no loop is done here."""
        owner = self._loop
        if owner.is_closed():
            self._dispose_without_loop()
            return
        coro = self.dispose()
        try:
            done = asyncio.run_coroutine_threadsafe(coro, owner)
        except RuntimeError:  # closed meanwhile
            coro.close()
            self._dispose_without_loop()
            return
        waited = asyncio.wrap_future(done)
        finished, _ = await asyncio.wait({waited}, timeout=_ELSEWHERE_WAIT_S)
        if finished:
            waited.result()
            return
        self._kill()

    def _dispose_without_loop(self) -> None:
        """The part of `dispose` that needs no event loop, for a sandbox whose loop is closed:
        the worker killed, its descriptors closed. Futures and tasks of a closed loop can
        never run again; nothing is left waiting on them."""
        self._state = _S.DISPOSED
        self._kill()
        self._remains.close_lifeline()
        self._remains.sock = None
        if self._sock is not None:
            self._sock.close()  # a closed loop's selector is closed: nothing to unregister
            self._sock = None
            self._out.clear()
        with contextlib.suppress(RuntimeError):  # a future's callbacks on the closed loop
            self._gateway.close_nowait()

    # -- channel --------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        sock = self._sock
        if sock is None:
            return
        if self._out:
            if len(self._out) + len(data) > MAX_OUTBOUND_BYTES:
                self._crash(_crashed("backpressure"))
                return
            self._out += data
            return
        try:
            sent = sock.send(data, _NOSIGNAL)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._crash(_crashed("send"))
            return
        if sent < len(data):
            self._out += data[sent:]
            self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            sent = sock.send(self._out, _NOSIGNAL)
        except BlockingIOError:
            return
        except OSError:
            self._crash(_crashed("send"))
            return
        del self._out[:sent]
        if not self._out:
            self._loop.remove_writer(self._fd)

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None or self._backlog is not None:
            # Frames of an earlier read still wait for their turn (`_handle_slice`): nothing
            # more is read until they are handled, so the decoder holds one read at most.
            return
        recv = _recv_buffer
        try:
            n = sock.recv_into(recv.buf)
        except BlockingIOError:
            return
        except OSError:
            n = 0
        self._received(recv.view[:n])

    def _received(self, data: memoryview) -> None:
        if not self._answered:
            self._answered = True
            self._poll.waited(self._loop.time() - self._sent_at)
        self._on_readable_data(data)

    def _begin_inline(self, job: _Job) -> None:
        """Send `job`, then read the worker's frames here, without a turn of the loop, until
        it ends, its host call waits on the loop, a window passes with nothing read, or the
        wait has held the loop for `MAX_HOLD_MS` (`_inline_wait`). No keep-hot callback is
        queued meanwhile: nothing else is waited for. Deadlines are on the monotonic clock,
        the one the C polling wait reads."""
        window = min(self._poll.window_s, INLINE_WAIT_US / 1e6)
        receive = self._poll_recv
        recv = _recv_buffer
        self._inline = True
        try:
            self._begin(job)
            now = monotonic()
            end = now + MAX_HOLD_S  # a worker sending frame after frame holds it no longer
            share = self._share
            while (
                self._sock is not None
                and self._job is job
                and not job.awaiting_host
                and share.busy == 1  # a host call that started another sandbox's job ends it
                and self._backlog is None  # a read's frames left for the loop's next turns
            ):
                try:
                    n = receive(recv.buf, min(now + window, end))
                except OSError:
                    n = 0
                if n < 0:
                    return  # nothing came: the loop's reader callback takes over
                self._received(recv.view[:n])
                now = monotonic()
                if now >= end:
                    # The polling wait reads before it looks at the clock, so a past deadline
                    # never ends it while the worker keeps its socket full (a hostile one held
                    # the loop, and every budget timer, for as long as it sent): the loop's
                    # reader callback takes the rest.
                    return
        finally:
            self._inline = False

    def _expect_answer(self) -> None:
        """The worker was just sent something it answers: poll for the answer if due."""
        self._answered = False
        self._sent_at = self._loop.time()
        if self._poll.on and self._hot is None and not self._inline:
            self._hot = self._loop.call_soon(self._keep_hot)

    def _keep_hot(self) -> None:
        # While this callback is queued the loop's selector does not block; one per sandbox,
        # so a loop with many sandboxes waiting still makes one `epoll_wait(0)` a turn.
        if (
            self._answered
            or self._sock is None
            or self._loop.time() - self._sent_at > self._poll.window_s
        ):
            self._hot = None
            return
        self._hot = self._loop.call_soon(self._keep_hot)

    def _on_readable_data(self, data: bytes | memoryview) -> None:
        if not data:
            self._crash(_crashed("eof"))
            return
        try:
            self._decoder.receive_data(data)
        except ProtocolError as exc:
            self._crash(_crashed(f"wire:{exc.details.get('reason')}"))
            return
        self._handle_slice()

    def _handle_slice(self) -> None:
        """Handle the frames read so far, at most `MAX_FRAMES_PER_TURN` of them in this turn
        of the loop; the rest in the next turns, before anything more is read."""
        self._backlog = None
        if self._sock is None:
            return
        decoder = self._decoder
        try:
            for _ in range(MAX_FRAMES_PER_TURN):
                msg = decoder.next_message()
                if msg is NEED_DATA:
                    break
                self._handle(msg)
                if self._sock is None:
                    return
            else:
                self._backlog = self._loop.call_soon(self._handle_slice)
                return
            if self._job is None and decoder.buffered and self._ready.done():
                # An honest worker sends nothing between its answer and the next job. A
                # frame begun while idle would be one more breach once whole (a log line, a
                # reply, a host call), and until then the host would keep its bytes (up to
                # DEFAULT_MAX_FRAME_BYTES a sandbox) with no budget running to end it.
                raise _crashed("data-outside-call")
        except ProtocolError as exc:
            self._crash(_crashed(f"wire:{exc.details.get('reason')}"))
        except SuaveplanError as exc:
            self._crash(exc)
        except Exception as exc:  # lifecycle rule: anything unexpected is terminal
            self._log_failure("worker channel failed", exc)
            self._crash(_crashed("host-error"))

    def _log_failure(self, what: str, exc: BaseException) -> str:
        """Log a host-side failure as the gateway does (`log_failure`): its type and a
        correlation id, never its text (which can hold what the worker sent, a secret
        included) or its frames; the traceback to `suaveplan_sandbox.vm.traceback`."""
        return log_failure(
            _log,
            _trace_log,
            exc,
            self._redactor,
            level=logging.ERROR,
            message="%s for plugin %s:",
            args=(what, self._plugin),
            fields={"plugin": self._plugin},
        )

    def _handle(self, msg: Message) -> None:
        kind = type(msg)
        if kind is Result or kind is Failure:
            assert isinstance(msg, Result | Failure)
            job = self._job
            if job is None or msg.id != job.id:
                if isinstance(msg, Failure) and msg.id == 0 and not self._ready.done():
                    hardened = self._hardening is not None
                    self._ready.set_exception(_startup_error(msg.error, hardened=hardened))
                    return
                raise _crashed("unexpected-reply")
            self._finish(job, msg)
        elif kind is HostCall:
            assert isinstance(msg, HostCall)
            job = self._job
            if job is None:
                raise _crashed("hostcall-outside-call")
            self._start_host_call(msg, job)
        elif kind is Log:
            assert isinstance(msg, Log)
            if self._job is None and self._ready.done():
                # An honest worker logs only while it loads or serves a job: an idle one
                # sending lines would have the host decode and log them for ever.
                raise _crashed("log-outside-call")
            self._on_log(msg.level, msg.text)
        elif isinstance(msg, Ready) and not self._ready.done():
            if self._hardening is None:  # the report comes first, before any plugin code
                raise _crashed("bad-ready")
            self._ready.set_result(msg)
        elif isinstance(msg, Hardened) and self._hardening is None and not self._ready.done():
            try:
                self._hardening = HardeningReport.from_wire(msg.hardening)
            except ValueError:
                raise _crashed("bad-hardened") from None
        else:
            raise _crashed("out-of-protocol")

    def _start_host_call(self, msg: HostCall, job: _Job) -> None:
        """Answer a host call inline when the gateway completes it here; otherwise when the
        gateway's task for it is done."""
        if job.awaiting_host:
            # The worker waits for each answer: a second request is a forged one, and serving
            # it would let a worker run any number of adapter calls at once.
            raise _crashed("hostcall-overlap")
        job.awaiting_host = True
        cap = msg.capability  # a name the gateway does not know is labelled `unknown` there
        op = msg.operation
        if (cap, op) in _NOT_ON_THE_VM_WIRE:
            op = _UNKNOWN_OPERATION
        try:
            if cap == "events":
                token = _event_depth.set(job.depth)
                try:
                    done, value = self._gateway.dispatch_eager(cap, op, msg.args)
                finally:
                    _event_depth.reset(token)
            else:
                done, value = self._gateway.dispatch_eager(cap, op, msg.args)
        except Exception as exc:
            self._reply(msg, job, failure=self._host_failure(msg, job, exc))
            return
        except BaseException as exc:
            # KeyboardInterrupt or SystemExit from an adapter: it is the host's to handle,
            # but the worker still gets its answer, or the call would stay in flight until
            # its budget ends and every call queued behind it would fail.
            self._reply(msg, job, failure=self._host_failure(msg, job, _interrupted(exc)))
            raise
        if done:
            self._reply(msg, job, value)
            return
        assert isinstance(value, asyncio.Task)
        task: asyncio.Task[Any] = value  # started eagerly, and suspended: it waits on I/O
        self._host_tasks.add(task)
        task.add_done_callback(lambda t: self._host_call_done(msg, job, t))

    def _host_call_done(self, msg: HostCall, job: _Job, task: asyncio.Task[Any]) -> None:
        self._host_tasks.discard(task)
        if task.cancelled():
            return  # disposed: nobody is waiting for the reply
        exc = task.exception()
        if exc is None:
            self._reply(msg, job, task.result())
        elif isinstance(exc, Exception):
            self._reply(msg, job, failure=self._host_failure(msg, job, exc))
        else:  # asyncio re-raised it from the loop; the worker is answered all the same
            self._reply(msg, job, failure=self._host_failure(msg, job, _interrupted(exc)))

    def _host_failure(self, msg: HostCall, job: _Job, exc: Exception) -> HostFailure:
        if isinstance(exc, SuaveplanError):
            if exc.code == _DENIED:
                key = (str(exc.details.get("capability")), str(exc.details.get("reason")))
                job.denials = job.denials | {key}
            return HostFailure(id=msg.id, error=exc.to_wire())  # type: ignore[arg-type]
        # The gateway translates adapter errors; answer, never leave the guest hanging.
        correlation = self._log_failure("host call failed", exc)
        return HostFailure(
            id=msg.id,
            error=SuaveplanError(  # type: ignore[arg-type]
                "SAND_ADAPTER_FAILED",
                "the host failed to serve the request",
                {"correlation_id": correlation},
            ).to_wire(),
        )

    def _reply(
        self, msg: HostCall, job: _Job, value: object = None, *, failure: HostFailure | None = None
    ) -> None:
        """Answer `msg` with `failure`, or else with a `HostReply` of `value`."""
        if self._job is not job:
            return  # the job ended (or the worker died) while the adapter ran
        job.awaiting_host = False
        try:
            if failure is not None:
                frame = encode(failure)
            else:  # the bytes of `encode(HostReply(...))`, without the object
                frame = encode_fields(HostReply, msg.id, value)
        except ProtocolError:
            frame = encode(
                HostFailure(
                    id=msg.id,
                    error=SuaveplanError(  # type: ignore[arg-type]
                        "SAND_WIRE_ERROR", "the host reply could not be encoded"
                    ).to_wire(),
                )
            )
        self._write(frame)
        self._expect_answer()

    # -- jobs -----------------------------------------------------------------------------
    def _begin(self, job: _Job) -> None:
        self._move("call")
        self._job = job
        self._share.busy += 1
        if self._wall_s is not None:  # the tracker's call clock serves the wall budget only
            self._tracker.start_call()
            self._deadline_at = self._loop.time() + self._wall_s
            # A timer left by an earlier job fires before this deadline (every job has the
            # same budget) and re-arms for it.
            if self._deadline is None:
                self._deadline = self._loop.call_at(self._deadline_at, self._on_deadline)
        if self._sampling and (self._sampler is None or self._sampler_idle):
            if self._sampler is not None:  # the idle cadence: a job is sampled closer
                self._sampler.cancel()
            self._sampler = self._loop.call_later(SAMPLE_INTERVAL_S, self._on_sample)
            self._sampler_idle = False
        self._write(job.frame)
        self._expect_answer()

    def _finish(self, job: _Job, msg: Result | Failure) -> None:
        # The budget timers stay armed: a firing with no job in flight (or a later one's
        # deadline still ahead) lapses or re-arms, which is cheaper than a timer per job.
        if self._sampling and self._loop.time() >= self._next_sample and not self._sample():
            return  # the sample breached a budget: the job failed with it
        err: SuaveplanError | None = None
        if job.awaiting_host:
            # The worker answered while its host call was still running: an honest one waits
            # for the reply, and ending the job would leave that adapter call behind, free to
            # run beside the next job's.
            raise _crashed("reply-during-hostcall")
        if type(msg) is Failure:
            wire = msg.error
            if type(wire.get("code")) is not str or type(wire.get("message")) is not str:
                # Not `to_wire()` data: from_wire would make it a SAND_WIRE_ERROR that the
                # caller gets while the worker lives on; a broken protocol ends the worker.
                raise _crashed("malformed-error")
            err = _recode_guest_error(SuaveplanError.from_wire(wire), job.denials)
            if self._is_memory_breach(err):
                return  # still the current job: the crash failed it with BUDGET_EXCEEDED
            if self._redactor.active:  # errors are diagnostics: no secret value handed out
                err = self._redactor.scrub_error(err)
        if self._wall_s is not None:
            self._tracker.end_call()
        self._job = None
        self._share.busy -= 1
        self._move("result")
        fut = job.fut
        if err is None:
            assert isinstance(msg, Result)
            if fut is None:
                self.events_delivered += 1
            elif not fut.done():
                fut.set_result(msg.value)
        elif fut is None:
            self.events_delivered += 1
            self.events_failed += 1
            self._note_event("failed", err.code)
        elif not fut.done():
            fut.set_exception(err)
        if self._log_allowance.held and self._log_allowance.take(self._now()):
            self._report_held_logs()
        while self._waiting and self._job is None and self._state is _S.IDLE:
            nxt = self._waiting.popleft()
            if nxt.fut is None:
                self._queued_events -= 1
                self._queued_event_bytes -= len(nxt.frame)
                self._begin(nxt)
            elif not nxt.fut.done():
                self._begin(nxt)

    def _is_memory_breach(self, err: SuaveplanError) -> bool:
        limit = self._tracker.budgets.memory_mb
        if err.code != "SAND_VM_PLUGIN_ERROR" or err.details.get("type") != "MemoryError":
            return False
        if limit is None:
            return False
        self._metrics.inc(
            "plugin.budget_exceeded_total", {"plugin": self._plugin, "budget": "memoryMb"}
        )
        self._crash(budget_error("memoryMb", limit=limit, observed=limit), count=False)
        return True

    # -- budgets --------------------------------------------------------------------------
    def _on_deadline(self) -> None:
        self._deadline = None
        if self._job is None:
            return  # lapses; the next job arms a new one
        if self._loop.time() < self._deadline_at - _EARLY_S:  # an earlier job's: re-arm
            self._deadline = self._loop.call_at(self._deadline_at, self._on_deadline)
            return
        try:
            self._tracker.tick()
        except SuaveplanError as exc:
            self._crash(exc, count=False)
            return
        # The tracker's clock has not reached the limit yet (an injected clock): look again.
        self._deadline = self._loop.call_later(SAMPLE_INTERVAL_S, self._on_deadline)

    def _on_sample(self) -> None:
        self._sampler = None
        before = self._loop.time()
        if self._sampling:
            if not self._sample():
                return  # a budget broke: the worker is gone
            cpu: float | None = self._cpu_s  # unchanged if the worker is gone: nothing grows
        else:
            proc = self._proc
            try:
                cpu = None if proc is None else _cpu_seconds(proc)
            except psutil.Error as exc:  # still there but unreadable: nothing is watched
                self._crash(_sampling_unavailable(exc, budgets=False))
                return
        if self._job is not None:
            self._idle_cpu = None  # a job in flight ends the idle stretch
            if cpu is not None and not self._watch_threads(cpu, before):
                return
            if self._sampling:
                self._sampler = self._loop.call_later(SAMPLE_INTERVAL_S, self._on_sample)
                self._sampler_idle = False
            else:  # without budgets the job costs nothing: the idle cadence stays
                self._sample_idle()
        elif cpu is None or (self._watch_idle(cpu) and self._watch_threads(cpu, before)):
            self._sample_idle()

    def _watch_idle(self, cpu: float) -> bool:
        """Judge an idle sample of `cpu` seconds; False if it ended the worker
        (`cpu-while-idle`).

        The budgets say nothing about a worker that escaped the interpreter, answered, and
        left threads spinning: without `cpuPercent` nothing else bounds them (the per-call
        RLIMIT_CPU is a soft limit it can raise, with SIGXCPU ignored), for the sandbox's
        life. An honest worker spends nothing between jobs (see `IDLE_CPU_LIMIT_S`), so any
        sandbox's worker that spends more than `IDLE_CPU_LIMIT_S` of CPU over one idle
        stretch is killed. A stretch starts at an idle sample and lasts while no job begins
        (the job count, `_next_id`, is unchanged) and none is in flight at a sample; its CPU
        is counted from that first sample, so a worker cannot stay under the limit by
        spending a little each interval, and the work of a job that ended between two
        samples (with its busy poll) falls before the stretch's first sample, never in it.
        No per-call cost: jobs only bump the count they already keep. One /proc read an
        interval, shared with the budget sample when there is one (which runs first: a
        cpuPercent breach keeps its own code), and with the one-thread watchdog, which an idle
        sample meets after this one (the stricter judge of a stretch keeps its code). The kill
        is coded like the other ways a worker breaks its side of the protocol,
        `SAND_VM_WORKER_CRASHED` with `why` `cpu-while-idle`, counted in
        `plugin.worker_crashed_total{cause}`: it is no budget the manifest set, so neither
        `BUDGET_EXCEEDED` nor its metric."""
        mark = self._next_id
        if self._idle_cpu is None or self._idle_mark != mark:
            self._idle_cpu, self._idle_mark = cpu, mark  # a new stretch begins here
            return True
        self.idle_checks += 1
        spent = cpu - self._idle_cpu
        if spent > IDLE_CPU_LIMIT_S:
            _log.warning(
                "[%s] the worker spent %.2f s of CPU with no job in flight: ended",
                self._plugin,
                spent,
            )
            self._crash(_crashed("cpu-while-idle"))
            return False
        return True

    def _watch_threads(self, cpu: float, before: float) -> bool:
        """Judge a sample of `cpu` seconds read after loop time `before`, job in flight or
        not; False if it ended the worker (`cpu-beyond-one-thread`).

        An honest worker is single-threaded, so its CPU time can never grow faster than the
        wall clock. One that escaped the interpreter can start threads (the seccomp filter
        lets `clone` make them) and, kept busy with jobs, is never idle for a stretch the idle
        watchdog judges: without `cpuPercent` its threads had every core, bounded only by the
        soft RLIMIT_CPU it can raise. So at every sample the CPU spent since the span's first
        reading is held to the wall time since (from the clock read before that reading to
        the one after this one) plus `THREAD_CPU_MARGIN_S`. Spans start at readings at least
        half an idle interval apart, and a sample is judged from the start before the latest:
        without budgets each sample of the idle cadence judges the last two intervals; with
        them the job samples, every `SAMPLE_INTERVAL_S` (where the 10 ms ticks of /proc would
        swamp one interval), are judged over at least half an idle interval. CPU a
        worker saves early in a span cannot be spent beyond it, so it keeps about one core
        on average. An idle sample meets the idle watchdog first, whose limit is stricter
        over a stretch. No per-call cost: one comparison a sample, on the /proc read the
        sampler already makes. Coded and counted like `cpu-while-idle`:
        `SAND_VM_WORKER_CRASHED` with `why` `cpu-beyond-one-thread`, in
        `plugin.worker_crashed_total{cause}`, never `BUDGET_EXCEEDED`."""
        after = self._loop.time()
        start = self._span_from
        if start is None:
            self._span_from = self._span_next = (before, cpu)
            return True
        self.thread_checks += 1
        spent = cpu - start[1]
        wall = after - start[0]
        if spent > wall + THREAD_CPU_MARGIN_S:
            _log.warning(
                "[%s] the worker spent %.2f s of CPU in %.2f s: more than one thread ran; ended",
                self._plugin,
                spent,
                wall,
            )
            self._crash(_crashed("cpu-beyond-one-thread"))
            return False
        if before - self._span_next[0] >= IDLE_SAMPLE_INTERVAL_S / 2:
            self._span_from, self._span_next = self._span_next, (before, cpu)
        return True

    def _sample_idle(self) -> None:
        """Keep sampling between jobs, at `IDLE_SAMPLE_INTERVAL_S`: an honest worker spends
        nothing while it waits for a job, but one that escaped the interpreter can leave
        threads spinning on every core, or fill memory, after it answered, where a sampler
        running only during jobs never looked (and its CPU rlimit is a soft limit it can
        raise). Every sandbox samples at this cadence, for the idle watchdog (`_watch_idle`)
        if not for a budget; with a CPU or RSS budget the next job brings the job cadence
        back (`_begin`), without one the cadence stays and a job costs nothing."""
        self._sampler = self._loop.call_later(IDLE_SAMPLE_INTERVAL_S, self._on_sample)
        self._sampler_idle = True

    def _sample(self) -> bool:
        """Feed the tracker one CPU/RSS sample; False if a budget broke (the worker is gone)."""
        proc = self._proc
        if proc is None:
            return True
        self._next_sample = self._loop.time() + SAMPLE_INTERVAL_S
        try:
            self._tracker.tick()
            with proc.oneshot():
                times = proc.cpu_times()
                rss = proc.memory_info().rss
            self._cpu_s = times.user + times.system
            self._tracker.sample_cpu(self._cpu_s)
            self._tracker.sample_memory(rss)
        except SuaveplanError as exc:
            self._crash(exc, count=False)
            return False
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return True  # the worker is gone: its socket's EOF ends the sandbox
        except psutil.Error as exc:  # still there but unreadable: the budget is unenforced
            self._crash(_sampling_unavailable(exc))
            return False
        return True

    # -- events ---------------------------------------------------------------------------
    def _subscriber(self, subscription: str) -> EventHandler:
        async def deliver(topic: str, payload: object) -> None:
            # Never await the delivery: a plugin publishing to its own subscription would
            # wait on itself. The job queue keeps deliveries in order with calls. A bus shared
            # with sandboxes on other loops (blocking facades) may call from another thread.
            if asyncio.get_running_loop() is self._loop:
                self._deliver(subscription, topic, payload)
            else:
                with contextlib.suppress(RuntimeError):  # that loop is closed: nobody listens
                    self._loop.call_soon_threadsafe(self._deliver, subscription, topic, payload)

        return deliver

    def _deliver(self, subscription: str, topic: str, payload: object) -> None:
        if self._state not in (_S.IDLE, _S.CALLING):
            return
        checker = self._gateway.checker
        if (
            not isinstance(topic, str)
            or not checker.may_deliver(topic)
            or not topic_matches(subscription, topic)
        ):
            # Counted like any denial (plugin.permission_denied_total{capability="events"}).
            checker.deny("events", DenyReason.EVENT_NOT_DECLARED)
            self.events_denied += 1
            return
        depth = _event_depth.get() + 1
        if depth > MAX_EVENT_DEPTH:
            self._drop_event("event-depth")
            return
        queued = self._job is not None or self._state is not _S.IDLE
        if queued and self._queued_events >= MAX_QUEUED_EVENTS:
            self._drop_event("event-queue-full")  # before the payload is encoded
            return
        self._next_id += 1
        try:
            frame = encode(
                Event(id=self._next_id, topic=topic, subscription=subscription, payload=payload)
            )
        except ProtocolError:
            _log.warning("[%s] event on a subscribed topic could not be encoded", self._plugin)
            return
        job = _Job(id=self._next_id, frame=frame, fut=None, topic=topic, depth=depth)
        if not queued:
            self._begin(job)
            return
        if self._queued_event_bytes + len(frame) > MAX_QUEUED_EVENT_BYTES:
            self._drop_event("event-queue-full")
            return
        self._queued_events += 1
        self._queued_event_bytes += len(frame)
        self._waiting.append(job)

    def _drop_event(self, reason: str) -> None:
        self.events_dropped += 1
        self._metrics.inc(EVENTS_DROPPED.name, {"plugin": self._plugin, "reason": reason})
        self._note_event("dropped", reason)

    def _note_event(self, outcome: str, reason: str) -> None:
        """Count a dropped or failed delivery; warn now if the throttle allows, else later."""
        key = (outcome, reason)
        self._events_held[key] = self._events_held.get(key, 0) + 1
        if self._event_allowance.take(self._now()):
            self._report_events()

    def _report_events(self) -> None:
        held, self._events_held = self._events_held, {}
        for (outcome, reason), count in held.items():
            _log.warning(
                "[%s] %d event deliveries %s (%s)",
                self._plugin,
                count,
                outcome,
                reason,
                extra={
                    "suaveplan": {
                        "plugin": self._plugin,
                        "reason": reason,
                        f"{outcome}_events": count,
                    }
                },
            )

    # -- plugin log lines -----------------------------------------------------------------
    def _on_log(self, level: str, text: str) -> None:
        if self._redactor.active:  # no secret value handed out, in `logs` or the host's log
            text = self._redactor.scrub(text)
        self.logs_total += 1
        logs = self._logs
        logs.append((level, text))
        self._log_chars += len(text)
        while len(logs) > MAX_RECORDED_LOGS or self._log_chars > MAX_RECORDED_LOG_CHARS:
            self._log_chars -= len(logs.popleft()[1])
        levelno = _LOG_LEVELS[level]
        if not _log.isEnabledFor(levelno):
            return  # the host logs nothing at this level: nothing to spare it
        allowance = self._log_allowance
        if not allowance.take(self._now()):
            allowance.held += 1
            self.logs_suppressed += 1
            self._metrics.inc(LOG_LINES_SUPPRESSED.name, {"plugin": self._plugin})
            return
        if allowance.held:
            self._report_held_logs()
        if len(text) > MAX_FORWARDED_LOG_CHARS:
            shown = f"{printable(text[:MAX_FORWARDED_LOG_CHARS])}... [{len(text)} characters]"
        else:
            shown = printable(text)
        _log.log(levelno, "[%s] %s", self._plugin, shown)

    def _report_held_logs(self) -> None:
        held = self._log_allowance.release_held()
        if held:
            _log.warning(
                "[%s] %d plugin log lines not logged (over %s a second); the most recent are"
                " in VmSandbox.logs",
                self._plugin,
                held,
                self._log_rate,
                extra={"suaveplan": {"plugin": self._plugin, "suppressed_lines": held}},
            )

    # -- calls ----------------------------------------------------------------------------
    async def call(self, name: str, /, *args: object, **kwargs: object) -> object:
        """Call the plugin's public top-level function `name`; returns its plain-data result.

        `name` is positional-only, so a plugin keyword may be called `name`. Arguments that
        are not plain data (a set, an object, an int past 64 bits, a dict key that is not a
        str), or too large for one frame, and a `name` that is not a str of 1-256 characters,
        are `SAND_INVALID_ARGUMENT`: refused here, nothing sent, the sandbox unaffected."""
        state = self._state
        if state is _S.DISPOSED:
            raise SuaveplanError("SAND_VM_DISPOSED", "the sandbox was disposed")
        if state is _S.CRASHED:
            assert self._fatal is not None
            raise _crashed("earlier-crash") from self._fatal
        if asyncio.get_running_loop() is not self._loop:
            # The socket, the job queue and the futures are the creating loop's: a call from
            # another loop (another thread) would reach the worker, racing that loop's
            # callbacks, and then fail with asyncio's "attached to a different loop".
            raise SuaveplanError(
                "SAND_INVALID_ARGUMENT",
                "the sandbox was called from an event loop other than the one that created it",
                {"reason": "wrong-event-loop"},
            )
        # The bytes of `encode(Call(...))`, after the same field checks, without the object.
        frame = _call_frame(self._next_id + 1, name, args, kwargs)
        self._next_id = call_id = self._next_id + 1
        fut: asyncio.Future[Any] = self._loop.create_future()
        job = _Job(call_id, frame, fut)
        if self._job is None and state is _S.IDLE:
            share = self._share
            if self._poll.on and share.may_wait_inline(self._loop):
                self._begin_inline(job)
                if fut.done():  # answered inline: no turn of the loop (`_inline_wait`)
                    return fut.result()
            else:
                self._begin(job)
        else:
            self._waiting.append(job)
        try:
            return await fut
        except asyncio.CancelledError:
            # A queued call is dropped; one in flight finishes in the worker, its reply ignored.
            with contextlib.suppress(ValueError):
                self._waiting.remove(job)
            raise

    async def _process_probe(self) -> object:
        """Test-only: raw OS calls inside the hardened worker (requires the probe flag)."""
        return await self.call(PROBE_CALL)

    # -- blocking facade ------------------------------------------------------------------
    @staticmethod
    def blocking(**kwargs: Any) -> BlockingVmSandbox:
        """A synchronous handle: the sandbox lives on a private event loop in a thread."""
        return BlockingVmSandbox(**kwargs)


_PRIVATE: Final = object()


def _check_required_layers(require_hardening: object) -> None:
    """`require_hardening` is a tuple or list of known layer names (a str is not taken
    apart into one-letter layers)."""
    if not isinstance(require_hardening, tuple | list) or not all(
        isinstance(layer, str) for layer in require_hardening
    ):
        raise bad_argument(
            "require_hardening",
            "require_hardening is a tuple or list of layer names",
            require_hardening,
        )
    unknown = [layer for layer in require_hardening if layer not in LAYERS]
    if unknown:
        raise SuaveplanError(
            "SAND_INVALID_ARGUMENT",
            "unknown hardening layer required",
            {"argument": "require_hardening", "layers": unknown, "known": list(LAYERS)},
        )


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
    data_dir: str | os.PathLike[str] | None = None,
    busy_poll_us: int = DEFAULT_BUSY_POLL_US,
    log_lines_per_s: int | None = DEFAULT_LOG_LINES_PER_S,
    redact: Iterable[str] = (),
    _test_process_probe: bool = False,
) -> VmSandbox:
    """Check the plugin, fork a hardened worker for it and wait until it is ready.

    Without `proxies=`, the sandbox opens (and on dispose closes) the standard adapter set for
    what the manifest grants (`open_standard_adapters`): fs beneath the policy root, public
    fetch, a private event bus, the audit log; SQLite under `data_dir` when the manifest has
    a database (without `data_dir`, db requests fail with `SAND_ADAPTER_MISSING`). Secrets
    need an explicit `proxies=` (nothing is read from the environment). `data_dir` belongs to
    that default set: with `proxies=` it would go unused, so the two together are refused
    (`SAND_INVALID_ARGUMENT`, `details.argument="data_dir"`) before anything starts.

    `busy_poll_us` (0 to `MAX_BUSY_POLL_US`): how long the host's loop and the worker poll
    for an answer before they block (see the module docstring), and whether a call may wait
    for its answer inline (`_inline_wait`); 0 trades call latency for idle CPU. The worker
    does not poll under a `cpuPercent` budget.

    `log_lines_per_s` (an int >= 0, or None for no limit): how many of the plugin's log
    lines a second (a burst of as many) reach the host's `logging`; the rest are counted in
    `logs_suppressed` and reported in one warning when the allowance returns. Every line is
    kept in `logs` (the most recent) whatever the rate. It runs on `clock` when one is given.

    `redact` (an iterable of str): credentials the host holds itself, kept out of every
    diagnostic like the secret values handed out (`Gateway`'s `redact=`); adapters that
    offer `redaction_values()` declare theirs without it.

    A plugin version the fork server has not seen is checked and compiled in a child of the
    fork server with 1 GiB of memory and 30 s of CPU (`vm._compile_child`); source needing
    more is refused (`SAND_VM_SYNTAX_FORBIDDEN`, reason `too-complex-to-compile`).
    """
    # Before anything is opened (`_create_arguments`).
    check_path_argument("plugin_module_path", plugin_module_path)
    check_path_argument("data_dir", data_dir, optional=True)
    check_common_create_arguments(
        policy=policy,
        proxies=proxies,
        plugin_name=plugin_name,
        metrics=metrics,
        clock=clock,
        audit=audit,
    )
    check_unused_with_proxies(proxies=proxies, data_dir=data_dir)
    _check_required_layers(require_hardening)
    if type(busy_poll_us) is not int or not 0 <= busy_poll_us <= MAX_BUSY_POLL_US:
        raise SuaveplanError(
            "SAND_INVALID_ARGUMENT",
            "busy_poll_us must be an int from 0 to MAX_BUSY_POLL_US",
            {"argument": "busy_poll_us", "max": MAX_BUSY_POLL_US},
        )
    if log_lines_per_s is not None and (type(log_lines_per_s) is not int or log_lines_per_s < 0):
        raise SuaveplanError(
            "SAND_INVALID_ARGUMENT",
            "log_lines_per_s must be an int >= 0, or None for no limit",
            {"argument": "log_lines_per_s"},
        )
    # The check: the plugin's coded refusal is raised here, before anything is opened. Off
    # the loop: reading the sources is file I/O, and the first create of a plugin of
    # megabytes (or a hostile one) waits seconds for the fork server's compile child, up to
    # its CPU limit, which would stall every sandbox on this loop. A thread hop costs a few
    # per cent of a create.
    bundle = await asyncio.to_thread(load_plugin, plugin_module_path)
    sb = VmSandbox(_token=_PRIVATE)
    sb._plugin = plugin_name or policy.plugin
    if clock is not None:
        sb._now = clock.now
    sb._log_rate = log_lines_per_s
    sb._log_allowance = _Allowance(log_lines_per_s, sb._now())
    sb._event_allowance = _Allowance(_EVENT_WARNINGS_PER_S, sb._now())
    sb._metrics = metrics if metrics is not None else InMemoryMetrics()
    checker = PermissionChecker(policy, plugin=sb._plugin, metrics=sb._metrics)
    if proxies is None:
        # The standard set for what the manifest grants; the sandbox owns and closes it.
        sb._owned = await open_standard_adapters(
            policy,
            data_dir=data_dir,
            audit_metrics=sb._metrics,
            db=None if data_dir is not None or policy.table_prefix is None else _NoDatabase(),
        )
        adapters = sb._owned.adapters
        if audit is None:
            audit = sb._owned.audit
    else:
        adapters = proxies
    try:
        sb._gateway = Gateway(
            checker=checker,
            adapters=adapters,
            audit=audit,
            clock=clock,
            on_denial=lambda deny, _cap, _op: sb._record_denial(deny),
            redact=redact,
        )
    except BaseException:
        # A bad `redact=` or an adapter that cannot state its credentials: there is no
        # gateway for `dispose()` to close, so only the adapters opened here are closed.
        if sb._owned is not None:
            await sb._owned.aclose()
        raise
    sb._redactor = sb._gateway.redactor
    budgets = policy.budgets
    sb._tracker = BudgetTracker(budgets, plugin=sb._plugin, metrics=sb._metrics, clock=clock)
    if budgets.wall_clock_ms is not None:
        # Just past the limit: the tracker breaches on elapsed > limit.
        sb._wall_s = budgets.wall_clock_ms / 1000.0 + 0.001
    sb._sampling = budgets.memory_mb is not None or budgets.cpu_percent is not None
    sb._poll = AdaptivePoll(busy_poll_us / 1e6)
    sb._worker_poll_us = 0 if budgets.cpu_percent is not None else busy_poll_us
    mem = budgets.memory_mb
    rlimits = (
        int(mem * 1024 * 1024) + INTERPRETER_SLACK_BYTES if mem is not None else None,
        cpu_backstop_seconds(budgets.wall_clock_ms) or DEFAULT_CPU_BACKSTOP_S,
    )
    host_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # The worker's lifeline: we hold the only write end; when this process ends, however it
    # ends, the kernel closes it and the worker is killed (see `arm_lifeline`).
    lifeline_r, sb._remains.lifeline = os.pipe()
    try:
        try:
            sb._remains.pid = fork_server().fork(
                bundle,
                worker_end,
                rlimits=rlimits,
                require=tuple(require_hardening),
                probe=_test_process_probe,
                lifeline=lifeline_r,
                busy_poll_us=sb._worker_poll_us,
            )
        finally:
            worker_end.close()
            os.close(lifeline_r)
        host_end.setblocking(False)
        sb._sock = sb._remains.sock = host_end
        sb._poll_recv = poll_receiver(host_end, _accel.poll_recv())
        sb._fd = host_end.fileno()
        sb._loop.add_reader(sb._fd, sb._on_readable)
        # The CPU/RSS sampler and the idle watchdog read it: one /proc read an interval.
        sb._proc = _sampled_process(sb._remains.pid, budgets=sb._sampling)
        if sb._wall_s is None:
            ready = await sb._ready
        else:
            # `shield`: on timeout the future stays ours (dispose settles it).
            start_s = sb._wall_s + START_GRACE_S
            try:
                ready = await asyncio.wait_for(asyncio.shield(sb._ready), start_s)
            except TimeoutError:
                raise _crashed("start-timeout") from None
        if len(ready.subscriptions) > MAX_SUBSCRIPTIONS:  # the guest runtime refuses more
            raise _crashed("too-many-subscriptions")
        if len(set(ready.subscriptions)) != len(ready.subscriptions):
            # The runtime keeps one handler per topic: a topic listed twice is a forged
            # report, and each copy would be one more delivery of every event to decode.
            raise _crashed("duplicate-subscriptions")
        sb._subscriptions = list(ready.subscriptions)
        sb._move("ready")
        sb._sample_idle()  # every sandbox: the idle watchdog (`_watch_idle`)
    except BaseException:
        if sb._sock is None:
            host_end.close()
        await sb.dispose()
        raise
    try:
        for topic in sb._subscriptions:
            await sb._gateway.dispatch(
                "events", "subscribe", {"topic": topic}, handler=sb._subscriber(topic)
            )
    except BaseException:
        # A subscription the manifest does not grant (or a failing bus) fails the creation:
        # the worker, its fds and the subscriptions made so far go with it.
        await sb.dispose()
        raise
    return sb


@final
class _NoDatabase:
    """The db adapter when the manifest has a database but the host gave no `data_dir`."""

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        raise SuaveplanError(
            "SAND_ADAPTER_MISSING", "the host provides no db adapter", {"capability": "db"}
        )


@final
class BlockingVmSandbox:
    """Blocking facade over `VmSandbox`: a private event loop runs in a daemon thread."""

    def __init__(self, **kwargs: Any) -> None:
        self._loop = LoopThread("suaveplan-vm-loop", disposed_code="SAND_VM_DISPOSED")
        try:
            self._sandbox: VmSandbox = self._loop.run(create_vm_sandbox(**kwargs))
        except BaseException:
            self._loop.stop()
            raise
        self._closed = False
        # Collected without dispose(): the loop thread (a daemon, holding the sandbox through
        # its loop) would keep the worker and their descriptors for the process's life.
        self._finalizer = weakref.finalize(self, self._loop.end_abandoned, self._sandbox.dispose)

    @property
    def hardening(self) -> HardeningReport:
        return self._sandbox.hardening

    @property
    def denials(self) -> list[Deny]:
        return self._sandbox.denials

    @property
    def denials_total(self) -> int:
        return self._sandbox.denials_total

    @property
    def logs(self) -> list[tuple[str, str]]:
        return self._sandbox.logs

    @property
    def logs_total(self) -> int:
        return self._sandbox.logs_total

    @property
    def logs_suppressed(self) -> int:
        return self._sandbox.logs_suppressed

    @property
    def events_dropped(self) -> int:
        return self._sandbox.events_dropped

    def call(self, name: str, /, *args: object, **kwargs: object) -> object:
        if self._closed:
            raise SuaveplanError("SAND_VM_DISPOSED", "the sandbox was disposed")
        return self._loop.run(self._sandbox.call(name, *args, **kwargs))

    def dispose(self) -> None:
        if self._closed:
            return
        # Closed only once the dispose ran: called from the loop's own thread it is refused
        # (SAND_INVALID_ARGUMENT) with the sandbox still open, for a later dispose to end.
        self._loop.run(self._sandbox.dispose())
        self._closed = True
        self._finalizer.detach()
        self._loop.stop()

    def __enter__(self) -> BlockingVmSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()


def create_vm_sandbox_sync(**kwargs: Any) -> BlockingVmSandbox:
    """Blocking `create_vm_sandbox` for scripts."""
    return BlockingVmSandbox(**kwargs)
