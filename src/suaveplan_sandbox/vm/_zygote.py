"""Host side of the fork server: start it lazily, send bundles once, ask for workers.

One `ForkServer` per host process (`fork_server()`); requests are synchronous and short
(a fork takes milliseconds), serialised by a lock so sandboxes on any thread or loop can
share it. The one long request is the `load` of a bundle the fork server has not compiled:
it checks and compiles it in a limited child (seconds for a plugin of megabytes) and answers
`loaded`, or `refused` with the plugin's coded error, which `load` raises as it came (the
host never parses plugin source itself). EOF on the control socket marks it dead; the next
request restarts it, and a request in flight when it died raises
`SAND_VM_FORK_SERVER_FAILED`.
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
        # Compile children the running zygote forked, as of the last `ping`.
        self.compiles = 0

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
        plugin seen for the first time.
        """

        if bundle.digest in self._loaded:
            return  # the common case, at no cost: a stale hint only means `fork` loads it

        def load() -> None:
            with self._lock:
                ctl = self._ensure()
                if bundle.digest not in self._loaded:
                    self._load(ctl, bundle, compile_memory_mb)

        _once_more_if_unsent(load)

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
                    self._load(ctl, bundle, DEFAULT_COMPILE_MEMORY_MB)
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

    def _load(self, ctl: socket.socket, bundle: PluginBundle, compile_memory_mb: int) -> None:
        wire = bundle.to_wire()
        packed = msgpack.packb(wire, use_bin_type=True)
        req: dict[str, Any] = {"op": "load", "compile_memory_mb": compile_memory_mb}
        if len(packed) <= _INLINE_BUNDLE_BYTES:
            rep = self._request(ctl, {**req, "bundle": wire}, [])
        else:
            fd = _anonymous_file()
            try:
                view = memoryview(packed)
                while view:
                    view = view[os.write(fd, view) :]
                rep = self._request(ctl, {**req, "bundle_bytes": len(packed)}, [fd])
            finally:
                os.close(fd)
        if rep.get("op") == "refused":
            raise _refusal(rep.get("error"))
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
            rep = self._request(self._ensure(), {"op": "ping"}, [])
            compiles = rep.get("compiles")
            self.compiles = compiles if type(compiles) is int else 0
            return int(rep["pid"])

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
