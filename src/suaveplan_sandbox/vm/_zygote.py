"""Host side of the fork server: start it lazily, send bundles once, ask for workers.

One `ForkServer` per host process (`fork_server()`), shared by sandboxes on any thread or
loop. Requests carry ids and may be outstanding together: a fork takes milliseconds, and the
one long request, the `load` of a bundle the fork server has not compiled, no longer holds
up anyone else's. The fork server checks and compiles such a bundle in a limited child
(seconds for a plugin of megabytes) while it serves other requests, and answers `loaded`, or
`refused` with the plugin's coded error, which `load` raises as it came (the host never
parses plugin source itself).

Theory of operation. A request registers its id under `_lock`, is sent without the lock (a
send that waits for room must not stop replies being read), and then waits on `_changed`
for its reply. Whichever waiting thread finds nobody reading becomes the reader: it takes
one message off the control socket outside the lock, files it (a reply under its id, an
`exited` notice in `exited` and `live`), wakes every waiter and lets the role go, so a reply
reaches its waiter however the threads interleave, and no thread reads while no request
waits (there is no reader thread to own, stop or count). EOF or an error on the socket
marks that zygote dead (it is killed if need be): every request waiting on it raises
`SAND_VM_FORK_SERVER_FAILED`, and the next request starts a fresh one. A socket is closed
only once no thread uses it any more, so no send or read can reach an fd reused meanwhile.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import msgpack

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import _accel
from suaveplan_sandbox.vm._compile_child import DEFAULT_COMPILE_MEMORY_MB, REFUSAL_CODES
from suaveplan_sandbox.vm._guest import PluginBundle
from suaveplan_sandbox.vm._hardening import LAYERS

_BOOTSTRAP: Final = (
    "import sys, json; sys.path[:0] = json.loads(sys.argv[2]); "
    "from suaveplan_sandbox.vm._zygote_main import main; main(int(sys.argv[1]))"
)


_T = TypeVar("_T")
_NOSIGNAL: Final = getattr(socket, "MSG_NOSIGNAL", 0)
_SEND_FAILED: Final = "send"
# Digests believed loaded in the zygote, a hint bounded like the zygote's own cache.
_LOADED_HINTS: Final = 1024
# Exit statuses kept in `ForkServer.exited`, the most recent: a long-lived host creates and
# disposes workers without end, and no status is read after its worker is gone.
MAX_EXITED: Final = 1024
# A bundle packed larger than this goes to the fork server in a memfd passed with the load
# request, not in the request's one datagram: a SOCK_SEQPACKET datagram cannot exceed the
# socket's send buffer (`net.core.wmem_default`, 208 KiB on many machines), and every plugin
# over about 200 KB failed as `SAND_VM_FORK_SERVER_FAILED` ("send").
_INLINE_BUNDLE_BYTES: Final = 64 * 1024


def _anonymous_file() -> int:
    """An fd of a regular file no other process can open by name: a memfd on Linux, else an
    unlinked temporary file."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        return int(memfd_create("suaveplan-bundle", os.MFD_CLOEXEC))
    with tempfile.TemporaryFile() as tmp:
        return os.dup(tmp.fileno())


def _failed(why: str, cause: BaseException | None = None) -> SuaveplanError:
    return SuaveplanError(
        "SAND_VM_FORK_SERVER_FAILED", "the fork server is unavailable", {"why": why}, cause
    )


def _refusal(wire: object) -> SuaveplanError:
    """The plugin's coded refusal as the zygote sent it; a code no check gives is the fork
    server's failure, never passed on as the plugin's."""
    err = SuaveplanError.from_wire(wire)
    if err.code not in REFUSAL_CODES:
        return _failed("load")
    return err


def _once_more_if_unsent(request: Callable[[], _T]) -> _T:
    """`request()`, retried once on a fresh zygote if it failed before anything reached the
    one found (it died since the last request and was not reaped yet)."""
    try:
        return request()
    except SuaveplanError as exc:
        if exc.details.get("why") != _SEND_FAILED:
            raise
    return request()


@dataclass(eq=False)
class _Channel:
    """One running zygote, its control socket and the requests waiting on it."""

    proc: subprocess.Popen[bytes]
    ctl: socket.socket
    # Request id -> its reply, None until it came.
    replies: dict[int, dict[str, Any] | None] = field(default_factory=dict)
    reading: bool = False  # a thread is taking a message off `ctl`
    users: int = 0  # threads between registering a request and being done with it
    dead: str | None = None  # why it ended, once it did
    cause: BaseException | None = None


class ForkServer:
    """A running zygote and its control socket (see the module docstring).

    `bootstrap`: the `-c` program that starts the zygote (tests wrap it in a hook)."""

    def __init__(self, *, bootstrap: str = _BOOTSTRAP) -> None:
        self._bootstrap = bootstrap
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._chan: _Channel | None = None
        # The running zygote's process and socket (the channel's), None while none runs.
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        self._loaded: set[str] = set()
        self._next_id = 0
        self.exited: dict[int, int] = {}
        self.live: set[int] = set()
        self.starts = 0
        # As of the last `ping`: compile children the running zygote forked, how many run
        # now, loads queued for a free one, and load requests waiting for an answer.
        self.compiles = 0
        self.compiling = 0
        self.queued = 0
        self.waiting = 0

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def _start(self) -> _Channel:
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        paths = [p for p in sys.path if p and Path(p).is_dir()]
        try:
            proc = subprocess.Popen(  # noqa: S603 - fixed argv, our own interpreter
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    self._bootstrap,
                    str(child.fileno()),
                    json.dumps(paths),
                ],
                # Empty, but for the switch that turns the C accelerator off (its polling
                # wait runs in the workers too): no host variable reaches the fork server.
                env={_accel.DISABLE_ENV: "1"} if _accel.env_disabled() else {},
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                close_fds=True,
                # A session (and process group) of its own, with no controlling terminal: a
                # worker signalling its group (`kill(0, ...)`) reaches the fork server's group,
                # never the host's, should every other layer be missing; and the terminal's
                # Ctrl-C goes to the host alone, which ends its sandboxes itself.
                start_new_session=True,
            )
        except OSError as exc:
            host.close()
            raise _failed("spawn", exc) from exc
        finally:
            child.close()
        chan = _Channel(proc=proc, ctl=host)
        self._chan, self._proc, self._ctl = chan, proc, host
        self._loaded = set()
        self.live = set()
        self.starts += 1
        return chan

    def _end(self, chan: _Channel, why: str, cause: BaseException | None = None) -> None:
        """Mark `chan`'s zygote dead (killing it), fail its waiters; under `_lock`."""
        if chan.dead is not None:
            return
        chan.dead, chan.cause = why, cause
        with contextlib.suppress(OSError):
            chan.ctl.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked on it
        with contextlib.suppress(OSError):
            chan.proc.kill()
        chan.proc.wait()
        if chan is self._chan:
            self._chan, self._proc, self._ctl = None, None, None
            self._loaded = set()
        self._release(chan)
        self._changed.notify_all()

    @staticmethod
    def _release(chan: _Channel) -> None:
        if chan.dead is not None and chan.users == 0:
            chan.ctl.close()

    def _ensure(self) -> _Channel:
        """The running zygote's channel, started if none runs; under `_lock`."""
        chan = self._chan
        if chan is not None and chan.proc.poll() is None:
            return chan
        if chan is not None:
            self._end(chan, "eof")
        return self._start()

    def _request(self, req: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], _Channel]:
        """Send `req` with `fds` and wait for its reply (and the channel it came on)."""
        with self._lock:
            chan = self._ensure()
            self._next_id += 1
            req_id = req["id"] = self._next_id
            chan.replies[req_id] = None
            chan.users += 1
        try:
            try:
                # MSG_NOSIGNAL: a fork server that died under a request costs an EPIPE,
                # never a SIGPIPE, whose default action ends a host that restored it.
                socket.send_fds(chan.ctl, [msgpack.packb(req, use_bin_type=True)], fds, _NOSIGNAL)
            except OSError as exc:
                with self._lock:
                    self._end(chan, "eof", exc)
                # Nothing reached the zygote: the caller may safely retry on a fresh one.
                raise _failed(_SEND_FAILED, exc) from exc
            return self._await(chan, req_id), chan
        finally:
            with self._lock:
                chan.replies.pop(req_id, None)
                chan.users -= 1
                self._release(chan)

    def _await(self, chan: _Channel, req_id: int) -> dict[str, Any]:
        while True:
            with self._lock:
                while True:
                    rep = chan.replies.get(req_id)
                    if rep is not None:
                        return rep
                    if chan.dead is not None:
                        raise _failed(chan.dead, chan.cause)
                    if not chan.reading:
                        chan.reading = True
                        break
                    self._changed.wait()
            try:
                data = chan.ctl.recv(65536)
            except BaseException as exc:
                # Whatever it was, a message may have been lost with it: no waiter on this
                # zygote could be sure of its reply any more.
                with self._lock:
                    chan.reading = False
                    self._end(chan, "io", exc)
                if isinstance(exc, OSError):
                    raise _failed("io", exc) from exc
                raise
            with self._lock:
                chan.reading = False
                self._file(chan, data)
                self._changed.notify_all()

    def _file(self, chan: _Channel, data: bytes) -> None:
        """File one message from `chan`'s zygote; under `_lock`."""
        if chan.dead is not None:
            return
        if not data:
            self._end(chan, "eof")
            return
        try:
            rep = msgpack.unpackb(data, raw=False)
        except Exception as exc:  # msgpack raises many types; all mean "malformed"
            self._end(chan, "io", exc)
            return
        if type(rep) is not dict:
            self._end(chan, "io")
            return
        pid = rep.get("pid")
        if rep.get("op") == "exited":
            if type(pid) is int:
                self.live.discard(pid)
                self.exited.pop(pid, None)  # a reused pid is the most recent again
                self.exited[pid] = rep.get("status", -1)
                if len(self.exited) > MAX_EXITED:
                    del self.exited[next(iter(self.exited))]
            return
        req_id = rep.get("id")
        if type(req_id) is int and req_id in chan.replies:
            if rep.get("op") == "forked" and type(pid) is int:
                # Here, in the order the zygote sent them, not when the requester wakes:
                # the worker's `exited` may be the very next message.
                self.live.add(pid)
            chan.replies[req_id] = dict(rep)

    def fork(
        self,
        bundle: PluginBundle,
        worker_sock: socket.socket,
        *,
        rlimits: tuple[int | None, int | None],
        require: tuple[str, ...],
        probe: bool = False,
        lifeline: int | None = None,
        busy_poll_us: int = 0,
    ) -> int:
        """Fork a worker serving `bundle` on `worker_sock` (our end is the caller's). Its pid.

        `lifeline`: the read end of a pipe whose write end only the caller holds; the worker
        is killed by the kernel when that end closes (the caller ended), busy or not.

        A zygote found dead when the request could not even be sent (it died since the last
        request and was not reaped yet) is restarted and the request retried once; one that
        dies after receiving it fails the request (it may have forked).

        A `require` naming no known layer is SAND_INVALID_ARGUMENT (a typo must not turn
        into a worker that merely crashes, nor into a layer silently not required). A bundle
        the zygote does not hold is loaded first (see `load`; default limits).
        """
        if not set(require) <= set(LAYERS):
            raise SuaveplanError(
                "SAND_INVALID_ARGUMENT",
                "unknown hardening layer required",
                {"layers": [n for n in require if n not in LAYERS], "known": list(LAYERS)},
            )
        fork = functools.partial(
            self._fork,
            bundle,
            worker_sock,
            rlimits=rlimits,
            require=require,
            probe=probe,
            lifeline=lifeline,
            busy_poll_us=busy_poll_us,
        )
        return _once_more_if_unsent(fork)

    def holds(self, digest: str) -> bool:
        """Whether the zygote is believed to hold this bundle compiled (a hint: a `fork`
        of one it dropped loads it again)."""
        return digest in self._loaded

    def load(
        self, bundle: PluginBundle, *, compile_memory_mb: int = DEFAULT_COMPILE_MEMORY_MB
    ) -> None:
        """Have the zygote check and compile `bundle`, unless it holds it already.

        The check and compile run in a child of the zygote whose address space may grow by
        `compile_memory_mb` at most (and whose CPU time is capped); the plugin's refusal
        (forbidden import or syntax, source too complex to compile within those limits) is
        raised with its own code. Blocks until the zygote answers: seconds for a large
        plugin seen for the first time (longer if other loads hold every compile child),
        while other threads' forks and loads go on.
        """
        if bundle.digest in self._loaded:
            return  # the common case, at no cost: a stale hint only means `fork` loads it
        _once_more_if_unsent(functools.partial(self._load, bundle, compile_memory_mb))

    def _fork(
        self,
        bundle: PluginBundle,
        worker_sock: socket.socket,
        *,
        rlimits: tuple[int | None, int | None],
        require: tuple[str, ...],
        probe: bool,
        lifeline: int | None,
        busy_poll_us: int,
    ) -> int:
        fds = [worker_sock.fileno()] + ([lifeline] if lifeline is not None else [])
        for attempt in range(2):
            if attempt or bundle.digest not in self._loaded:
                self._load(bundle, DEFAULT_COMPILE_MEMORY_MB)
            req = {
                "op": "fork",
                "digest": bundle.digest,
                "rlimits": list(rlimits),
                "require": list(require),
                "probe": probe,
                "busy_poll_us": busy_poll_us,
            }
            rep, chan = self._request(req, fds)
            if rep.get("op") == "forked":
                break
            # The zygote dropped it (it keeps the most recently used only): load it again.
            if attempt or rep.get("why") != "unknown-digest":
                raise _failed(str(rep.get("why", "fork")))
            with self._lock:
                if chan is self._chan:
                    self._loaded.discard(bundle.digest)
        return int(rep["pid"])  # `live` has it already (see `_file`)

    def _load(self, bundle: PluginBundle, compile_memory_mb: int) -> None:
        wire = bundle.to_wire()
        packed = msgpack.packb(wire, use_bin_type=True)
        req: dict[str, Any] = {"op": "load", "compile_memory_mb": compile_memory_mb}
        if len(packed) <= _INLINE_BUNDLE_BYTES:
            rep, chan = self._request({**req, "bundle": wire}, [])
        else:
            fd = _anonymous_file()
            try:
                view = memoryview(packed)
                while view:
                    view = view[os.write(fd, view) :]
                rep, chan = self._request({**req, "bundle_bytes": len(packed)}, [fd])
            finally:
                os.close(fd)
        if rep.get("op") == "refused":
            raise _refusal(rep.get("error"))
        if rep.get("op") != "loaded":
            raise _failed(str(rep.get("why", "load")))
        with self._lock:
            if chan is not self._chan:
                return  # answered by a zygote since replaced: the hint is not for this one
            if len(self._loaded) >= _LOADED_HINTS:
                self._loaded.clear()  # only a hint of what the zygote holds: a miss reloads
            self._loaded.add(bundle.digest)

    def fork_bare(self, sock: socket.socket) -> int:
        """Benchmark baseline: fork a child that writes one byte on `sock` and waits for EOF."""
        rep, _ = self._request({"op": "bare"}, [sock.fileno()])
        if rep.get("op") != "forked":
            raise _failed(str(rep.get("why", "fork")))
        return int(rep["pid"])

    def ping(self) -> int:
        """The zygote's pid (starting it if needed); also collects exit notices and the
        compile counts (`compiles`, `compiling`, `queued`, `waiting`)."""
        rep, _ = self._request({"op": "ping"}, [])
        counts = [rep.get(k) for k in ("compiles", "compiling", "queued", "waiting")]
        self.compiles, self.compiling, self.queued, self.waiting = (
            n if type(n) is int else 0 for n in counts
        )
        return int(rep["pid"])

    def shutdown(self) -> None:
        with self._lock:
            if self._chan is not None:
                self._end(self._chan, "shutdown")


_server: ForkServer | None = None
_server_lock = threading.Lock()


def fork_server() -> ForkServer:
    """The process-wide fork server (created lazily; started on first use)."""
    global _server  # noqa: PLW0603 - one fork server per process
    with _server_lock:
        if _server is None:
            _server = ForkServer()
        return _server
