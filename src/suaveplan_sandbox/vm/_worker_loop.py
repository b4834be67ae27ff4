"""Worker side of the channel: runs in the forked, hardened child and serves calls.

Blocking and single-threaded: read a frame, run the plugin, write the reply. Calls and event
deliveries are both answered with `Result`/`Failure` of their id (the host sends the next
one only then); anything else arriving while a call waits on a host call is queued.

Per call this costs one `recv` (into a buffer allocated in the fork server, so a read
neither allocates nor, after the first, faults a page) and one `sendall`; the hot replies
are encoded from their fields (`encode_fields`), with the message classes' checks.

Waiting is adaptive busy polling (`busy_poll_s`, set by the host; 0 turns it off): before a
blocking `recv`, the worker polls the socket without blocking for up to that long, yielding
the CPU between polls (`sched_yield`: a runnable host or sibling worker goes first). Waking
a process blocked in `recv` costs this machine's kernel more than the rest of a round trip
(a halted CPU has to be woken), and the answer usually comes within tens of microseconds:
a host call's reply, or the next call when calls come back to back. Each kind of wait
polls only while its last wait was answered within the window (`AdaptivePoll`), so a
worker that waits long — an idle plugin, a slow adapter — stops polling after one miss
and then polls only one wait in `REPROBE_EVERY + 1`, to find out whether answers come fast
again. The polling itself is `poll_receiver`'s: the C accelerator's loop when it is built,
its Python twin otherwise; the host's inline waits use the same.

Plugin code runs only inside a call or delivery, between the worker's own reads and writes.
The cyclic garbage collector would break that: a collection that a decode's allocations
start runs the finalizers (`__del__`) of the plugin's garbage right there, and one that
calls the host re-entered the channel's decoder mid-frame, took the outer host call's answer
and left that call waiting until its budget ended (or broke the protocol). So automatic
collection is on only while plugin code runs (`_plugin_code`); the worker's own code never
triggers it. A host call made while another waits for its answer is refused with a coded
error all the same (a finalizer run by reference counting, not by the collector).
"""

from __future__ import annotations

import functools
import gc
import os
import socket
from collections import deque
from collections.abc import Callable
from time import monotonic
from typing import Final, NoReturn

from suaveplan_sandbox.errors import SuaveplanError
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
    Ready,
    Result,
    encode,
    encode_fields,
)
from suaveplan_sandbox.vm._guest import CompiledBundle, GuestRuntime

PROBE_CALL = "__suaveplan_process_probe__"
# How long a wait polls before it blocks (`create_vm_sandbox(busy_poll_us=...)`), host and
# worker alike. A round trip has measured 20-60 us on a quiet two-core VM and 70-200 us on a
# slower one, where a host call's reply (the gateway's work included) missed a 100 us window
# often enough to double a proxied read's latency; 200 us catches back-to-back answers and
# host-call replies on both, and a miss costs that much CPU once (then see REPROBE_EVERY).
DEFAULT_BUSY_POLL_US: Final = 200
MAX_BUSY_POLL_US: Final = 10_000
# After a slow answer, polling is tried again on every this-many-plus-first wait.
REPROBE_EVERY: Final = 16
_RECV_BYTES = 262144
# Allocated at import, i.e. in the fork server: every worker inherits it copy-on-write.
_recv_buffer = bytearray(_RECV_BYTES)
_DONTWAIT: Final = socket.MSG_DONTWAIT


class AdaptivePoll:
    """Whether the next wait of one kind polls before it blocks.

    Yes while the last wait of this kind was answered within `window_s` (polling would have
    caught the answer); no after one that was not, until a wait is answered that fast again
    or `REPROBE_EVERY` slow waits have passed, when one wait polls again. Without that probe,
    where a blocking wait's own wake-up takes longer than the window (a slow or busy virtual
    machine), one late answer would turn polling off for good, though polled answers come
    within the window. So a sandbox whose answers are always slow polls in one wait out of
    `REPROBE_EVERY + 1`. A window of 0 never polls.
    """

    __slots__ = ("_slow", "on", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.on = window_s > 0
        self._slow = 0  # slow waits since polling was last tried

    def waited(self, seconds: float) -> None:
        """Record how long a wait of this kind took, from its start to the answer."""
        if self.window_s <= 0:
            return
        if seconds <= self.window_s:
            self.on = True
            self._slow = 0
        elif self.on:
            self.on = False
        else:
            self._slow += 1
            if self._slow >= REPROBE_EVERY:
                self.on = True
                self._slow = 0


def _poll_recv_python(sock: socket.socket, buf: bytearray, deadline: float) -> int:
    """The C accelerator's `poll_recv`, on `sock`: bytes read into `buf` (0 at end of file),
    or -1 once `time.monotonic()` passed `deadline` with nothing to read. Errors raise."""
    while True:
        try:
            return sock.recv_into(buf, 0, _DONTWAIT)
        except BlockingIOError:
            if monotonic() > deadline:
                return -1
            os.sched_yield()  # the other process may share this CPU


NativePoll = Callable[[int, bytearray, float], int]
# `permissions._accel.DISABLE_ENV`, which the fork server is started with when the host has
# it; not imported from there: `permissions` brings the host's stack (pydantic, sqlglot...),
# which the fork server never loads.
_NO_SPEEDUPS_ENV: Final = "SUAVEPLAN_SANDBOX_NO_SPEEDUPS"


def worker_native_poll() -> NativePoll | None:
    """The C accelerator's `poll_recv` for a worker: None when it is not built or switched off.
    Called at import, in the fork server: a hardened worker could not load it (Landlock)."""
    if os.environ.get(_NO_SPEEDUPS_ENV, "") not in ("", "0"):
        return None
    try:
        from suaveplan_sandbox import _speedups
    except ImportError:
        return None
    native: NativePoll | None = getattr(_speedups, "poll_recv", None)
    return native


_WORKER_NATIVE_POLL: Final = worker_native_poll()


def poll_receiver(
    sock: socket.socket, native: NativePoll | None
) -> Callable[[bytearray, float], int]:
    """`receive(buf, deadline)`: poll `sock` until something arrives or the monotonic clock
    passes `deadline` (-1); `native` (the accelerator's `poll_recv`) when given, else its
    Python twin."""
    if native is None:
        return functools.partial(_poll_recv_python, sock)
    return functools.partial(native, sock.fileno())


class _Channel:
    def __init__(self, sock: socket.socket, busy_poll_s: float = 0.0) -> None:
        self.sock = sock
        self.decoder = FrameDecoder()
        self.backlog: deque[Message] = deque()
        self._view = memoryview(_recv_buffer)
        self.for_call = AdaptivePoll(busy_poll_s)  # the next call or event, after a reply
        self.for_host = AdaptivePoll(busy_poll_s)  # a host call's answer
        self._poll_recv = poll_receiver(sock, _WORKER_NATIVE_POLL)

    def send(self, msg: Message) -> None:
        self.sock.sendall(encode(msg))

    def send_frame(self, frame: bytes) -> None:
        self.sock.sendall(frame)

    def read(self, poll: AdaptivePoll) -> Message:
        decoder = self.decoder
        while True:
            msg = decoder.next_message()
            if msg is not NEED_DATA:
                assert isinstance(msg, Message)
                return msg
            n = self._recv(poll)
            if not n:
                raise SystemExit(0)
            decoder.receive_data(self._view[:n])  # copied: the buffer is reused

    def _recv(self, poll: AdaptivePoll) -> int:
        began = monotonic()
        if poll.on:
            n = self._poll_recv(_recv_buffer, began + poll.window_s)
            if n >= 0:
                poll.waited(monotonic() - began)
                return n
        n = self.sock.recv_into(_recv_buffer)
        poll.waited(monotonic() - began)
        return n


def _process_probe() -> dict[str, object]:
    """Test-only: raw OS calls after hardening. Reached only when the host enabled the probe."""
    import os
    import sys

    out: dict[str, object] = {}

    def attempt(name: str, fn: object) -> None:
        try:
            assert callable(fn)
            fn()
            out[name] = "allowed"
        except OSError as exc:
            out[name] = f"denied:{exc.errno}"

    attempt("open_etc_passwd", lambda: os.close(os.open("/etc/passwd", os.O_RDONLY)))
    attempt("socket_inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
    attempt("fork", os.fork)
    attempt("exec", lambda: os.execv("/bin/true", ["/bin/true"]))  # noqa: S606
    out["env"] = dict(os.environ)
    out["modules"] = sorted(sys.modules)  # what the fork server loaded, inherited
    try:
        out["fds"] = sorted(int(n) for n in os.listdir("/proc/self/fd"))  # noqa: PTH208
    except OSError as exc:
        out["fds"] = f"denied:{exc.errno}"
    return out


def _plugin_code(run: Callable[..., object], *args: object) -> object:
    """`run(*args)` with automatic garbage collection on: the only place plugin finalizers
    may run (module docstring)."""
    gc.enable()
    try:
        return run(*args)
    finally:
        gc.disable()


def _nested_host_call() -> SuaveplanError:
    return SuaveplanError(
        "SAND_VM_PLUGIN_ERROR",
        "a host call was made while another was waiting for its answer",
        {"type": "RuntimeError", "reason": "nested-host-call"},
    )


def _answer(chan: _Channel, call_id: int, run: Callable[..., object], *args: object) -> None:
    """Run one call or event delivery, `run(*args)`, and send its `Result` or coded `Failure`."""
    try:
        value = _plugin_code(run, *args)
    except SuaveplanError as exc:
        chan.send(Failure(id=call_id, error=exc.to_wire()))  # type: ignore[arg-type]
    except MemoryError:
        err = SuaveplanError(
            "SAND_VM_PLUGIN_ERROR", "the plugin ran out of memory", {"type": "MemoryError"}
        )
        chan.send(Failure(id=call_id, error=err.to_wire()))  # type: ignore[arg-type]
    else:
        chan.send_frame(encode_fields(Result, call_id, value))


def serve(
    sock: socket.socket,
    compiled: CompiledBundle,
    hardening: dict[str, object],
    *,
    process_probe: bool,
    busy_poll_s: float = 0.0,
) -> NoReturn:
    chan = _Channel(sock, busy_poll_s)
    next_id = 0
    waiting = False  # a host call is waiting for its answer

    def host_call(capability: str, operation: str, args: dict[str, object]) -> object:
        nonlocal next_id, waiting
        if waiting:
            raise _nested_host_call()
        waiting = True
        gc.disable()  # the worker's own code from here to the answer (module docstring)
        try:
            next_id += 1
            my_id = next_id
            chan.send_frame(encode_fields(HostCall, my_id, capability, operation, args))
            while True:
                msg = chan.read(chan.for_host)
                if type(msg) is HostReply and msg.id == my_id:
                    return msg.value
                if type(msg) is HostFailure and msg.id == my_id:
                    raise SuaveplanError.from_wire(msg.error)
                chan.backlog.append(msg)
        finally:
            waiting = False
            gc.enable()

    def log(level: str, text: str) -> None:
        chan.send(
            Log(
                level=level if level in {"debug", "info", "warning", "error"} else "info",
                text=text[:65536],
            )
        )

    # Before any plugin code runs: after it, a worker's word is the plugin's word.
    chan.send(Hardened(hardening=hardening))
    runtime = GuestRuntime(compiled, host_call=host_call, log=log)
    gc.disable()  # on only while plugin code runs (module docstring)
    try:
        _plugin_code(runtime.start)
    except SuaveplanError as exc:
        chan.send(Failure(id=0, error=exc.to_wire()))  # type: ignore[arg-type]
        raise SystemExit(0) from None
    chan.send(Ready(subscriptions=runtime.subscriptions()))
    while True:
        msg = chan.backlog.popleft() if chan.backlog else chan.read(chan.for_call)
        if type(msg) is Call:
            if process_probe and msg.name == PROBE_CALL:
                chan.send(Result(id=msg.id, value=_process_probe()))
                continue
            _answer(chan, msg.id, runtime.call, msg.name, msg.args, msg.kwargs)
        elif type(msg) is Event:
            _answer(chan, msg.id, runtime.deliver, msg.subscription, msg.payload)
        else:
            raise SystemExit(3)  # out-of-protocol message from the host
