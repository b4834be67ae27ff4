"""Host side of the compile children: compile untrusted modules in processes of their own.

Theory of operation. Cranelift's cost is not bounded by a module's size (`_compile_bounds`
only caps the amplifiers we know), and an allocation that fails inside it aborts the process
that runs it. So the host never compiles a guest's module itself: `compile_server()` is this
process's `CompilePool` of at most `MAX_CHILDREN` long-lived children (`CompileServer`, one
child and its socket each), started on first need and reused, so a create pays a socket round
trip, not an interpreter start. A child is the host's own interpreter (`sys.executable`,
spawned with fork+exec by `subprocess` — never a bare fork of the possibly multi-threaded
host, never a `python3` found on PATH), in isolated mode with an empty environment, no stdio,
a session of its own, and only `_compile_child_main` and the leaf modules it needs loaded
(`_compile_wire`, `_engine_config`, `arm_lifeline`'s module, wasmtime). It builds its engine
from `engine_config()` and announces `SETTINGS_TAG` and its wasmtime; the host refuses a child
that differs (its artefacts would not load here, or worse, would mean something else).

Why two children, not one or many. With one, every create of a new module queued behind the
compile in progress — tens of seconds of CPU for a module within the bounds, 60 s by default
for a hostile one — while a second child lets the next new module compile meanwhile. Each
child may map up to its compile's `memory_bytes` (2 GiB by default) and use one core, so the
pool's worst case is `MAX_CHILDREN` times that, both cores of the two we plan for; two keeps
that bounded and known (a third compile waits for a free child; an idle second child costs
about 25 MB). A second child is started only while the first is busy. Creates of the *same*
module never need two: `_engine` makes them share one compile, and a cached module (in memory
or on disk) asks no child at all.

Parent death. A child must not outlive its host: a host SIGKILLed mid-compile would otherwise
leave it compiling for up to its `cpu_seconds`. Each child gets a lifeline, the read end of a
pipe whose only write end the host holds (close-on-exec, closed in a fork of the host); the
child arms it with O_ASYNC and itself as owner, SIGIO at its default, terminating action
(`vm._hardening.arm_lifeline`, as the VM's workers do), so the kernel signals it the moment
the host's last copy of the write end closes, however the host ended, even while the child is
inside Cranelift. Not PR_SET_PDEATHSIG: it fires when the *thread* that spawned the child
exits, and creates spawn from worker threads (`asyncio.to_thread`) that an executor may retire
while the host lives on. (An idle child also sees EOF on its socket, and exits.)

A request is one COMPILE frame (`_compile_wire`) carrying the module and the create's
`CompileLimits.memory_bytes` / `cpu_seconds`, which the child applies as soft RLIMIT_AS /
RLIMIT_CPU around that compile alone. A caller reserves a child for its request
(`CompilePool.reserve`), so frames never interleave and a reply is checked — and its artefact
loaded — before the child serves anyone else; the host waits at most `WALL_FACTOR` times
`cpu_seconds` plus `WALL_SLACK_S` of wall-clock time (a stopped or starved child) and reads a
reply only after checking its header: an expected kind, a length within the compile's memory
cap, and for an artefact the sha256 of the bytes it sent.

Lifecycle of a child, per request:

| what happens                                   | the caller gets               | child   |
|------------------------------------------------|-------------------------------|---------|
| COMPILED                                       | `Compiled` (artefact)         | kept    |
| REFUSED / FAILED (wasmtime's own answer)       | `Refused`                     | kept    |
| found dead, or the send fails                  | retried once on a fresh child | restart |
| EOF, the child ended by a signal (SIGABRT on a | `compile-resources`           | restart |
| failed allocation, SIGXCPU, SIGKILL, the OOM   |                               |         |
| killer) or out of memory in Python             |                               |         |
| EOF, the child exited otherwise                | `compile-child-failed`        | restart |
| no reply in time                               | `compile-timeout`             | killed  |
| a malformed reply                              | `compile-reply-malformed`     | killed  |
| cannot start, or differs from the host         | `compile-child-unavailable`   | killed  |
| the host ends (any way)                        | —                             | SIGIO   |

Every failure is `SAND_WASM_INSTANTIATION_FAILED` with `details.stage="compile"` and
`details.reason` as above (plus `signal` or `exit` when the child died); the next request
starts a fresh child. The host process itself never runs Cranelift on a guest's bytes.

The child is a resource boundary, not a security one: it runs as the host's user without
seccomp. A compiler bug that a module could exploit would control the child and, through the
artefact it returns, code the host runs — exactly as it would compiling in-process.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Final, final

import wasmtime

from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.wasm._compile_child_main import EXIT_OUT_OF_MEMORY
from suaveplan_sandbox.wasm._compile_wire import (
    DIGEST_BYTES,
    HEADER,
    MAX_PAYLOAD,
    MAX_TEXT_BYTES,
    READY,
    REPLIES,
    Compiled,
    MalformedFrame,
    Refused,
    encode_compile_head,
    parse_header,
    parse_ready,
    parse_reply,
)
from suaveplan_sandbox.wasm._engine_config import SETTINGS_TAG

# The host waits for a reply at most WALL_FACTOR times the compile's CPU seconds plus
# WALL_SLACK_S: the CPU limit ends a busy child; this ends the wait on a stopped or starved one.
WALL_FACTOR: Final = 4
WALL_SLACK_S: Final = 10.0
# How long a new child may take to import wasmtime and say READY (≈ 0.05 s when idle).
READY_TIMEOUT_S: Final = 30.0
# Compiles in flight at once, each in a child of its own (see "Why two children").
MAX_CHILDREN: Final = 2
# After EOF the child is exiting, but its descriptors close before the kernel reports how it
# ended, and on a loaded machine that gap passed the one second once allowed (a child killed
# by a signal was reported as `compile-child-failed`, no signal). `_reap` looks up to
# REAP_CHECKS times, each wait REAP_CHECK_S long: at least 10 s, more when the host itself is
# starved (each wait then takes longer), never unbounded. A child still running then closed
# its end without exiting: it is killed.
REAP_CHECKS: Final = 200
REAP_CHECK_S: Final = 0.05
# How long a killed child may take to be reaped. SIGKILL cannot be caught, but a process in
# uninterruptible sleep ends only once it leaves it: past this the host stops waiting, and
# `subprocess` reaps it later (a Popen dropped while still running is polled at the next one).
KILLED_WAIT_S: Final = 5.0

# Run by the child (`python -I -S -c`): argv[1] is its socket, argv[2] says where the package
# and wasmtime live, argv[3] is its lifeline. The packages are stand-in modules so that
# importing `_compile_child_main` (and `arm_lifeline`'s module) runs no `__init__` (they load
# the whole host side).
_BOOTSTRAP: Final = (
    "import json, sys, types\n"
    "where = json.loads(sys.argv[2])\n"
    "for name, path in where['packages']:\n"
    "    module = types.ModuleType(name)\n"
    "    module.__path__ = [path]\n"
    "    sys.modules[name] = module\n"
    "sys.path[:0] = where['path']\n"
    "from suaveplan_sandbox.wasm._compile_child_main import main\n"
    "main(int(sys.argv[1]), int(sys.argv[3]))\n"
)
_NOSIGNAL: Final = getattr(socket, "MSG_NOSIGNAL", 0)  # a dead child must not SIGPIPE the host


def _failed(
    reason: str, cause: BaseException | None = None, **details: WireValue
) -> SuaveplanError:
    return SuaveplanError(
        "SAND_WASM_INSTANTIATION_FAILED",
        "the module could not be compiled",
        {"stage": "compile", "reason": reason, **details},
        cause,
    )


class _Eof(Exception):
    pass


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        k = sock.recv_into(view[got:])
        if k == 0:
            raise _Eof
        got += k
    return buf


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        view = view[sock.send(view, _NOSIGNAL) :]


def _interpreter() -> str:
    exe = sys.executable
    if not exe or not Path(exe).is_absolute() or not os.access(exe, os.X_OK):
        raise _failed("compile-child-unavailable", why="no-interpreter")
    return exe


def _where() -> str:
    package = Path(__file__).resolve().parent.parent
    paths = [p for p in sys.path if p and Path(p).is_dir()]
    return json.dumps(
        {
            "packages": [
                ["suaveplan_sandbox", str(package)],
                ["suaveplan_sandbox.wasm", str(package / "wasm")],
                ["suaveplan_sandbox.vm", str(package / "vm")],
                ["suaveplan_sandbox.vm._hardening", str(package / "vm" / "_hardening")],
            ],
            "path": paths,
        }
    )


@final
class CompileServer:
    """A compile child and the socket to it; see the module docstring."""

    def __init__(self, *, bootstrap: str = _BOOTSTRAP) -> None:
        # `bootstrap` is the child's program: tests swap in a forged child.
        self._bootstrap = bootstrap
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._lifeline = -1  # the write end of the child's lifeline; -1: none
        self._owner = os.getpid()
        self.starts = 0  # children started
        self.requests = 0  # requests that reached a child
        self.busy_pid: int | None = None  # the child compiling right now, if any
        _servers.add(self)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @contextlib.contextmanager
    def reserve(self) -> Iterator[CompileServer]:
        """This server, for one request (its own lock keeps requests apart)."""
        yield self

    def compile(self, source: bytes, *, memory_bytes: int, cpu_seconds: int) -> Compiled | Refused:
        """Compile `source` in the child under these limits; raises the coded failures."""
        head = encode_compile_head(len(source), memory_bytes=memory_bytes, cpu_seconds=cpu_seconds)
        if len(source) > MAX_PAYLOAD - len(head):
            raise _failed("compile-request-too-large")
        max_reply = min(DIGEST_BYTES + max(memory_bytes, MAX_TEXT_BYTES), MAX_PAYLOAD)
        with self._lock:
            deadline = time.monotonic() + WALL_FACTOR * cpu_seconds + WALL_SLACK_S
            for attempt in (1, 2):
                sock, proc = self._ensure()
                try:
                    _send_all(sock, head, deadline)
                    _send_all(sock, source, deadline)
                    break
                except TimeoutError as exc:
                    self._stop()
                    raise _failed("compile-timeout", exc) from exc
                except OSError as exc:
                    # The child died before it took the request (it was not compiling it):
                    # a fresh one may.
                    self._stop()
                    if attempt == 2:
                        raise _failed("compile-child-unavailable", exc, why="send") from exc
                except BaseException:
                    self._stop()  # interrupted mid-frame: the stream's position is lost
                    raise
            self.requests += 1
            self.busy_pid = proc.pid
            try:
                return self._receive(sock, source, deadline, max_reply)
            finally:
                self.busy_pid = None

    def close(self) -> None:
        """Stop the child (the next request starts another); idempotent."""
        with self._lock:
            self._stop()

    def _receive(
        self, sock: socket.socket, source: bytes, deadline: float, max_reply: int
    ) -> Compiled | Refused:
        try:
            kind, length = parse_header(
                bytes(_recv_exact(sock, HEADER.size, deadline)),
                expect=REPLIES,
                max_payload=max_reply,
            )
            return parse_reply(kind, _recv_exact(sock, length, deadline), source=source)
        except MalformedFrame as exc:
            self._stop()
            raise _failed("compile-reply-malformed", exc, why=exc.why) from exc
        except TimeoutError as exc:
            self._stop()
            raise _failed("compile-timeout", exc) from exc
        except (_Eof, OSError) as exc:
            status = self._stop(wait=True)
            reason = "compile-resources" if "signal" in status else "compile-child-failed"
            if status.get("exit") == EXIT_OUT_OF_MEMORY:
                reason = "compile-resources"
            raise _failed(reason, exc if isinstance(exc, OSError) else None, **status) from exc
        except BaseException:
            # Interrupted mid-frame (say, KeyboardInterrupt): the stream's position is lost.
            self._stop()
            raise

    def _ensure(self) -> tuple[socket.socket, subprocess.Popen[bytes]]:
        if self._owner != os.getpid():  # a fork of the host: the child is the parent's
            self._forget()
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock, self._proc
        self._stop()
        return self._start()

    def _forget(self) -> None:
        """In a fork of the host: let go of the parent's child without touching it."""
        if self._sock is not None:
            self._sock.close()
        self._sock = self._proc = None
        self._close_lifeline()
        self._owner = os.getpid()

    def _close_lifeline(self) -> None:
        fd, self._lifeline = self._lifeline, -1
        if fd >= 0:
            os.close(fd)

    def _start(self) -> tuple[socket.socket, subprocess.Popen[bytes]]:
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # Both ends close-on-exec (os.pipe): only this child is given the read end, and no
        # child of the host ever inherits the write end.
        try:
            lifeline, keep = os.pipe()
        except OSError as exc:
            host.close()
            child.close()
            raise _failed("compile-child-unavailable", exc, why="spawn") from exc
        try:
            proc = subprocess.Popen(  # noqa: S603 — fixed argv, the host's own interpreter
                [
                    _interpreter(),
                    "-I",
                    "-S",
                    "-c",
                    self._bootstrap,
                    str(child.fileno()),
                    _where(),
                    str(lifeline),
                ],
                env={},
                pass_fds=(child.fileno(), lifeline),
                stdin=subprocess.DEVNULL,
                # wasmtime reports a failed allocation on stderr before it aborts: a guest's
                # module must not write into the host's logs.
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
            )
        except (OSError, SuaveplanError) as exc:
            host.close()
            os.close(keep)
            if isinstance(exc, SuaveplanError):
                raise
            raise _failed("compile-child-unavailable", exc, why="spawn") from exc
        finally:
            child.close()
            os.close(lifeline)
        self._proc, self._sock, self._lifeline = proc, host, keep
        self.starts += 1
        try:
            head = _recv_exact(host, HEADER.size, time.monotonic() + READY_TIMEOUT_S)
            _, length = parse_header(
                bytes(head), expect=frozenset({READY}), max_payload=MAX_TEXT_BYTES
            )
            ready = parse_ready(_recv_exact(host, length, time.monotonic() + READY_TIMEOUT_S))
        except (MalformedFrame, _Eof, OSError) as exc:
            self._stop()
            raise _failed("compile-child-unavailable", exc, why="ready") from exc
        if ready.settings != SETTINGS_TAG or ready.wasmtime != wasmtime.__file__:
            self._stop()
            raise _failed("compile-child-unavailable", why="engine-mismatch")
        return host, proc

    def _stop(self, *, wait: bool = False) -> dict[str, WireValue]:
        """Close the socket and end the child; how it ended, if it ended on its own.

        `wait`: the child closed its end (it is exiting), so give it time (`_reap`) to say how it
        ended before killing it; otherwise it is killed at once. The lifeline is closed last:
        closed first, its SIGIO would be how the child ended.
        """
        if self._owner != os.getpid():  # a fork of the host: the child is the parent's
            self._forget()
            return {}
        sock, proc = self._sock, self._proc
        self._sock = self._proc = None
        if sock is not None:
            sock.close()
        try:
            return _reap(proc, wait=wait)
        finally:
            self._close_lifeline()


def _reap(proc: subprocess.Popen[bytes] | None, *, wait: bool) -> dict[str, WireValue]:
    """How `proc` ended, reaping it; `{}` when it had to be killed (or is gone unreaped).

    `wait`: it closed its end, so give it `REAP_CHECKS` waits to finish exiting (see there);
    otherwise it is killed unless it has already ended. No wait here is unbounded.
    """
    if proc is None:
        return {}
    for _ in range(REAP_CHECKS if wait else 1):
        try:
            return _how_it_ended(proc.wait(timeout=REAP_CHECK_S if wait else 0))
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILLED_WAIT_S)
    return {}


def _how_it_ended(code: int) -> dict[str, WireValue]:
    if code < 0:
        try:
            return {"signal": signal.Signals(-code).name}
        except ValueError:
            return {"signal": -code}
    return {"exit": code}


@final
class CompilePool:
    """At most `size` compile children, each serving one request at a time.

    `reserve()` lends a caller the first idle slot (so a second child starts only while the
    first is busy, and a dead first child is replaced rather than worked around) and waits
    while all are busy.
    """

    def __init__(self, *, size: int = MAX_CHILDREN, bootstrap: str = _BOOTSTRAP) -> None:
        self._slots = tuple(CompileServer(bootstrap=bootstrap) for _ in range(size))
        self._busy: set[CompileServer] = set()
        self._idle = threading.Condition()

    @property
    def pid(self) -> int | None:
        """The first running child's pid, else None."""
        return next((pid for s in self._slots if (pid := s.pid) is not None), None)

    @property
    def busy_pid(self) -> int | None:
        """A child compiling right now, if any."""
        return next((pid for s in self._slots if (pid := s.busy_pid) is not None), None)

    @property
    def starts(self) -> int:
        return sum(s.starts for s in self._slots)

    @property
    def requests(self) -> int:
        return sum(s.requests for s in self._slots)

    @contextlib.contextmanager
    def reserve(self) -> Iterator[CompileServer]:
        """An idle child's server, for one request and checking its reply."""
        with self._idle:
            while True:
                slot = next((s for s in self._slots if s not in self._busy), None)
                if slot is not None:
                    self._busy.add(slot)
                    break
                self._idle.wait()
        try:
            yield slot
        finally:
            with self._idle:
                self._busy.discard(slot)
                self._idle.notify()

    def compile(self, source: bytes, *, memory_bytes: int, cpu_seconds: int) -> Compiled | Refused:
        """`CompileServer.compile` on an idle child."""
        with self.reserve() as server:
            return server.compile(source, memory_bytes=memory_bytes, cpu_seconds=cpu_seconds)

    def close(self) -> None:
        """Stop every child (each after the request it serves, if any); idempotent."""
        for slot in self._slots:
            slot.close()


# Every server of this process, so that a fork of the host can let go of their lifelines.
_servers: weakref.WeakSet[CompileServer] = weakref.WeakSet()


class _Shared:
    pool: CompilePool | None = None
    lock = threading.Lock()


def compile_server() -> CompilePool:
    """This process's compile pool (its first child starts at the first compile)."""
    with _Shared.lock:
        if _Shared.pool is None:
            _Shared.pool = CompilePool()
            atexit.register(_Shared.pool.close)
        return _Shared.pool


def _forget_after_fork() -> None:
    # A forked host must not share its parent's children (frames would interleave), hold
    # their lifelines (they would outlive the parent as long as the fork lives), nor a lock
    # another thread held at the fork.
    for server in list(_servers):
        with contextlib.suppress(OSError):
            server._close_lifeline()
    _Shared.pool = None
    _Shared.lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
