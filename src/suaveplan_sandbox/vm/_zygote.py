"""Host side of the fork server: start it lazily, send bundles once, ask for workers.

One `ForkServer` per host process (`fork_server()`); requests are synchronous and short
(a fork takes milliseconds), serialised by a lock so sandboxes on any thread or loop can
share it. EOF on the control socket marks it dead; the next request restarts it, and a
request in flight when it died raises `SAND_VM_FORK_SERVER_FAILED`.
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
from pathlib import Path
from typing import Any, Final

import msgpack

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import _accel
from suaveplan_sandbox.vm._guest import PluginBundle
from suaveplan_sandbox.vm._hardening import LAYERS

_BOOTSTRAP: Final = (
    "import sys, json; sys.path[:0] = json.loads(sys.argv[2]); "
    "from suaveplan_sandbox.vm._zygote_main import main; main(int(sys.argv[1]))"
)


_SEND_FAILED: Final = "send"
# Digests believed loaded in the zygote, a hint bounded like the zygote's own cache.
_LOADED_HINTS: Final = 1024
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


class ForkServer:
    """A running zygote and its control socket."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        self._loaded: set[str] = set()
        self._next_id = 0
        self.exited: dict[int, int] = {}
        self.live: set[int] = set()
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> socket.socket:
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        paths = [p for p in sys.path if p and Path(p).is_dir()]
        try:
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv, our own interpreter
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    _BOOTSTRAP,
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
        self._ctl = host
        self._loaded = set()
        self.live = set()
        self.starts += 1
        return host

    def _mark_dead(self) -> None:
        if self._ctl is not None:
            self._ctl.close()
        self._ctl = None
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.kill()
            self._proc.wait()
        self._proc = None
        self._loaded = set()

    def _request(self, ctl: socket.socket, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        self._next_id += 1
        req["id"] = self._next_id
        try:
            try:
                socket.send_fds(ctl, [msgpack.packb(req, use_bin_type=True)], fds)
            except OSError as exc:
                # Nothing reached the zygote: the caller may safely retry on a fresh one.
                raise _failed(_SEND_FAILED, exc) from exc
            while True:
                data = ctl.recv(65536)
                if not data:
                    raise _failed("eof")
                rep = msgpack.unpackb(data, raw=False)
                if rep.get("op") == "exited":
                    self.live.discard(rep["pid"])
                    self.exited[rep["pid"]] = rep["status"]
                    continue
                if rep.get("id") == req["id"]:
                    return dict(rep)
        except SuaveplanError:
            self._mark_dead()
            raise
        except OSError as exc:
            self._mark_dead()
            raise _failed("io", exc) from exc

    def _ensure(self) -> socket.socket:
        if self._ctl is not None and self._proc is not None and self._proc.poll() is None:
            return self._ctl
        if self._ctl is not None:
            self._mark_dead()
        return self._start()

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
        into a worker that merely crashes, nor into a layer silently not required).
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
        try:
            return fork()
        except SuaveplanError as exc:
            if exc.details.get("why") != _SEND_FAILED:
                raise
        return fork()

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
        with self._lock:
            ctl = self._ensure()
            for attempt in range(2):
                if attempt or bundle.digest not in self._loaded:
                    self._load(ctl, bundle)
                req = {
                    "op": "fork",
                    "digest": bundle.digest,
                    "rlimits": list(rlimits),
                    "require": list(require),
                    "probe": probe,
                    "busy_poll_us": busy_poll_us,
                }
                rep = self._request(ctl, req, fds)
                if rep.get("op") == "forked":
                    break
                # The zygote dropped it (it keeps the most recently used only): load it again.
                if attempt or rep.get("why") != "unknown-digest":
                    raise _failed(str(rep.get("why", "fork")))
                self._loaded.discard(bundle.digest)
            pid = int(rep["pid"])
            self.live.add(pid)
            return pid

    def _load(self, ctl: socket.socket, bundle: PluginBundle) -> None:
        wire = bundle.to_wire()
        packed = msgpack.packb(wire, use_bin_type=True)
        if len(packed) <= _INLINE_BUNDLE_BYTES:
            rep = self._request(ctl, {"op": "load", "bundle": wire}, [])
        else:
            fd = _anonymous_file()
            try:
                view = memoryview(packed)
                while view:
                    view = view[os.write(fd, view) :]
                rep = self._request(ctl, {"op": "load", "bundle_bytes": len(packed)}, [fd])
            finally:
                os.close(fd)
        if rep.get("op") != "loaded":
            raise _failed(str(rep.get("why", "load")))
        if len(self._loaded) >= _LOADED_HINTS:
            self._loaded.clear()  # only a hint of what the zygote holds: a miss reloads
        self._loaded.add(bundle.digest)

    def fork_bare(self, sock: socket.socket) -> int:
        """Benchmark baseline: fork a child that writes one byte on `sock` and waits for EOF."""
        with self._lock:
            rep = self._request(self._ensure(), {"op": "bare"}, [sock.fileno()])
            if rep.get("op") != "forked":
                raise _failed(str(rep.get("why", "fork")))
            pid = int(rep["pid"])
            self.live.add(pid)
            return pid

    def ping(self) -> int:
        """The zygote's pid (starting it if needed); also collects exit notices."""
        with self._lock:
            return int(self._request(self._ensure(), {"op": "ping"}, [])["pid"])

    def shutdown(self) -> None:
        with self._lock:
            self._mark_dead()


_server: ForkServer | None = None
_server_lock = threading.Lock()


def fork_server() -> ForkServer:
    """The process-wide fork server (created lazily; started on first use)."""
    global _server  # noqa: PLW0603 - one fork server per process
    with _server_lock:
        if _server is None:
            _server = ForkServer()
        return _server
