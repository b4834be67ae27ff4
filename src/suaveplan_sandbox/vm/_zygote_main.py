"""Fork server (zygote) entry point: `python -I -S -c <bootstrap> <sys.path json>`.

Single-threaded. Reads requests from the control SEQPACKET socket (fd 3 in its argv):
`load` caches a compiled bundle by digest (the `_MAX_COMPILED` most recently used: a
long-lived host cycling through plugin versions must not grow the zygote, and with it
every fork's page tables, without bound; a `fork` of a dropped digest is answered
`unknown-digest` and the host loads it again). A bundle not cached is checked and compiled
in a short-lived child with capped memory and CPU (`_compile_child`), never in the zygote
itself: parsing costs hundreds of times the source's size, and every worker would inherit
the zygote's peak. It answers `loaded`, or `refused` with the plugin's coded error; a cached
bundle costs no child. `fork` (with one socket fd via SCM_RIGHTS) forks a
worker that hardens itself, keeps only that fd and serves calls; `bare` forks a child that only
writes one byte (the benchmark's baseline for a fork through this server); `ping` answers its
pid (and how many compile children it forked). A request that is malformed in any way
(bytes, shape, fields, fds) is answered `{"op": "error", "code": "SAND_WIRE_ERROR", "why":
...}` and the zygote keeps serving.
Children are reaped with waitpid(WNOHANG) on every wake-up and reported as `exited`.

Nothing outlives the host. EOF on the control socket (the host exited or was SIGKILLed; the
kernel closes its end) ends the zygote. A `fork` may carry a second fd, the read end of a
*lifeline* pipe whose only write end the host holds: the worker arms it first thing
(`arm_lifeline`: O_ASYNC, SIGIO at its default action, which terminates), so the kernel
kills it when the host's end closes, busy or not, while it still outlives its zygote (a
killed fork server is restarted; live sandboxes keep their workers). Parent-death signals
are not used: they fire when the *thread* that forked ends, and tie a worker to the zygote.

Cost: every page a forked child writes first costs it a copy-on-write fault (~3.5 µs on this
kind of VM), so the child's path is kept short. Everything not particular to one sandbox is
done before any fork (imports, facades, sealed classes, compiled bundles, the hardening
plan with its seccomp program and Landlock ruleset attributes), and what is particular to
one (its rlimits, kept fds, required layers) is decoded and built in the zygote before the
fork, where it costs plain CPU; the child then only applies it.
"""

from __future__ import annotations

import _socket
import contextlib
import os
import select
import signal
import socket
import stat
import sys
from dataclasses import dataclass
from typing import Any, Final, NoReturn

import msgpack

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.protocol import Failure, encode
from suaveplan_sandbox.vm import _compile_child
from suaveplan_sandbox.vm._compile_child import (
    DEFAULT_COMPILE_MEMORY_MB,
    MAX_COMPILE_MEMORY_MB,
    MIN_COMPILE_MEMORY_MB,
    CompileLimits,
    compile_in_child,
    refusal_wire,
)
from suaveplan_sandbox.vm._guest import CompiledBundle, PluginBundle
from suaveplan_sandbox.vm._hardening import (
    LAYERS,
    HardeningPlan,
    RlimitSettings,
    apply_hardening,
    arm_lifeline,
    reset_signal_to_default,
)
from suaveplan_sandbox.vm._worker_loop import MAX_BUSY_POLL_US, serve

_MAX_REQUEST = 8 * 1024 * 1024
_MAX_COMPILED: Final = 128
_SIGCHLD: Final = int(signal.SIGCHLD)


def _send(ctl: socket.socket, obj: dict[str, Any]) -> None:
    try:
        ctl.send(msgpack.packb(obj, use_bin_type=True))
    except OSError:
        raise SystemExit(0) from None


@dataclass(frozen=True, slots=True)
class _Worker:
    """One validated `fork` request, built before the fork (see the module docstring)."""

    compiled: CompiledBundle
    rlimits: RlimitSettings
    require: tuple[str, ...]
    keep_fds: tuple[int, ...]
    probe: bool
    busy_poll_s: float


def _child(ctl: socket.socket, wsock: socket.socket, plan: HardeningPlan, job: _Worker) -> None:
    reset_signal_to_default(_SIGCHLD)
    # The C close: socket.socket.close is Python-level and costs the fork more pages.
    _socket.socket.close(ctl)
    try:
        report = apply_hardening(
            plan, keep_fds=job.keep_fds, rlimits=job.rlimits, require=job.require
        )
    except SuaveplanError as exc:
        wsock.sendall(encode(Failure(id=0, error=exc.to_wire())))  # type: ignore[arg-type]
        os._exit(0)
    try:
        serve(
            wsock,
            job.compiled,
            report.to_wire(),
            process_probe=job.probe,
            busy_poll_s=job.busy_poll_s,
        )
    except SystemExit as exc:
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    except BaseException:
        os._exit(2)


_WIRE = "SAND_WIRE_ERROR"


class _BadRequest(Exception):
    """A control request the zygote cannot serve; answered with a coded error, never fatal."""

    def __init__(self, why: str, req_id: object = None) -> None:
        super().__init__(why)
        self.why = why
        self.req_id = req_id if type(req_id) is int else None


def _bare_child(ctl: socket.socket, wsock: socket.socket) -> None:
    """Benchmark baseline: a fork that reports ready and waits for EOF, doing nothing else."""
    ctl.close()
    try:
        wsock.sendall(b"r")
        while wsock.recv(64):
            pass
    finally:
        os._exit(0)


def _run_child(  # noqa: PLR0917
    ctl: socket.socket,
    wsock: socket.socket,
    lifeline: int,
    wake: tuple[int, int],
    plan: HardeningPlan,
    job: _Worker | None,
) -> NoReturn:
    """The forked child's whole life. It never returns: an exception let back into the
    zygote's loop would have this unhardened copy answer (and read) the control socket as a
    second fork server."""
    try:
        if lifeline >= 0:
            arm_lifeline(lifeline)  # first: from here on the worker dies with its host
        os.close(wake[0])
        os.close(wake[1])
        signal.set_wakeup_fd(-1)
        if job is None:
            _bare_child(ctl, wsock)
        else:
            _child(ctl, wsock, plan, job)
    except BaseException:
        os._exit(2)
    os._exit(0)


def _serve_request(  # noqa: PLR0917
    ctl: socket.socket,
    data: bytes,
    fds: list[int],
    cache: dict[str, CompiledBundle],
    children: set[int],
    plan: HardeningPlan,
    wake: tuple[int, int],
) -> None:
    try:
        req = msgpack.unpackb(data, raw=False, strict_map_key=True, max_ext_len=0)
    except Exception as exc:  # msgpack raises many types; all mean "malformed"
        raise _BadRequest("undecodable") from exc
    if type(req) is not dict:
        raise _BadRequest("not-a-request")
    req_id = req.get("id")
    if type(req_id) is not int:
        raise _BadRequest("bad-id")
    try:
        _dispatch(ctl, req_id, req, fds, cache, children, plan, wake)
    except _BadRequest:
        raise
    except Exception as exc:
        raise _BadRequest("internal", req_id) from exc


def _bundle_in_fd(fds: list[int], size: object, req_id: int) -> object:
    """The bundle the host wrote to the file (a memfd) in `fds`, decoded; the fd is taken
    from `fds` and closed here. The file must be a regular one of exactly `size` bytes, at
    most `_MAX_REQUEST`, as an inline request is."""
    fd = fds.pop()  # ours now: the request loop does not close it a second time
    try:
        if type(size) is not int or not 0 < size <= _MAX_REQUEST:
            raise _BadRequest("bad-bundle-size", req_id)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            raise _BadRequest("bad-bundle-fd", req_id)
        data = bytearray()
        while len(data) < size:
            chunk = os.pread(fd, size - len(data), len(data))
            if not chunk:
                raise _BadRequest("bad-bundle-fd", req_id)
            data += chunk
    except OSError as exc:
        raise _BadRequest("bad-bundle-fd", req_id) from exc
    finally:
        os.close(fd)
    try:
        return msgpack.unpackb(bytes(data), raw=False, strict_map_key=True, max_ext_len=0)
    except Exception as exc:  # msgpack raises many types; all mean "malformed"
        raise _BadRequest(f"bundle:{_WIRE}", req_id) from exc


def _dispatch(  # noqa: PLR0917
    ctl: socket.socket,
    req_id: int,
    req: dict[Any, Any],
    fds: list[int],
    cache: dict[str, CompiledBundle],
    children: set[int],
    plan: HardeningPlan,
    wake: tuple[int, int],
) -> None:
    op = req.get("op")
    if op == "load":
        raw_bundle = req.get("bundle")
        if "bundle_bytes" in req:  # a large bundle: in the one fd passed with the request
            if len(fds) != 1:
                raise _BadRequest("need-one-fd", req_id)
            raw_bundle = _bundle_in_fd(fds, req.get("bundle_bytes"), req_id)
        elif fds:
            raise _BadRequest("unexpected-fds", req_id)
        memory_mb = req.get("compile_memory_mb", DEFAULT_COMPILE_MEMORY_MB)
        if type(memory_mb) is not int or not (
            MIN_COMPILE_MEMORY_MB <= memory_mb <= MAX_COMPILE_MEMORY_MB
        ):
            raise _BadRequest("bad-compile-limits", req_id)
        try:
            bundle = PluginBundle.from_wire(raw_bundle)
        except SuaveplanError as exc:
            raise _BadRequest(f"bundle:{exc.code}", req_id) from exc
        compiled = cache.pop(bundle.digest, None)
        if compiled is None:
            limits = CompileLimits(memory_bytes=memory_mb * 1024 * 1024)
            try:
                compiled = compile_in_child(
                    bundle, limits, plan=plan, close_in_child=(ctl.fileno(), *wake)
                )
            except SuaveplanError as exc:  # the plugin's verdict: nothing is cached
                _send(ctl, {"op": "refused", "id": req_id, "error": refusal_wire(exc)})
                return
            except OSError as exc:
                raise _BadRequest("compile-fork-failed", req_id) from exc
        cache[bundle.digest] = compiled  # most recently used: last
        while len(cache) > _MAX_COMPILED:
            del cache[next(iter(cache))]
        _send(ctl, {"op": "loaded", "id": req_id})
    elif op in ("fork", "bare"):
        if not (len(fds) == 1 or (op == "fork" and len(fds) == 2)):
            raise _BadRequest("need-one-fd", req_id)
        lifeline = fds[1] if len(fds) == 2 else -1
        if lifeline >= 0 and not stat.S_ISFIFO(os.fstat(lifeline).st_mode):
            raise _BadRequest("bad-lifeline", req_id)
        job = None
        if op == "fork":
            digest, rl, require = req.get("digest"), req.get("rlimits"), req.get("require")
            poll_us = req.get("busy_poll_us", 0)
            hit = cache.pop(digest, None) if isinstance(digest, str) else None
            if hit is None:
                raise _BadRequest("unknown-digest", req_id)
            cache[hit.digest] = hit  # most recently used: last
            if (
                type(rl) is not list
                or len(rl) != 2
                or not all(v is None or (type(v) is int and v > 0) for v in rl)
                or type(require) is not list
                or not all(type(r) is str and r in LAYERS for r in require)
                or type(poll_us) is not int
                or not 0 <= poll_us <= MAX_BUSY_POLL_US
            ):
                raise _BadRequest("bad-fork-fields", req_id)
            job = _Worker(
                compiled=hit,
                rlimits=RlimitSettings(address_space_bytes=rl[0], cpu_seconds=rl[1]),
                require=tuple(require),
                keep_fds=(fds[0], lifeline) if lifeline >= 0 else (fds[0],),
                probe=bool(req.get("probe")),
                busy_poll_s=poll_us / 1e6,
            )
        try:
            wsock = socket.socket(fileno=fds[0])
        except OSError as exc:
            raise _BadRequest("bad-fd", req_id) from exc
        try:
            pid = os.fork()
        except OSError as exc:
            wsock.close()
            raise _BadRequest("fork-failed", req_id) from exc
        if pid == 0:
            _run_child(ctl, wsock, lifeline, wake, plan, job)
        wsock.close()
        if lifeline >= 0:
            os.close(lifeline)
        children.add(pid)
        _send(ctl, {"op": "forked", "id": req_id, "pid": pid})
    elif op == "ping":
        compiles = _compile_child.forked_total
        _send(ctl, {"op": "pong", "id": req_id, "pid": os.getpid(), "compiles": compiles})
    else:
        raise _BadRequest("unknown-op", req_id)


def _peer_gone(ctl: socket.socket) -> bool:
    """SEQPACKET reads 0 bytes for an empty datagram and for EOF; only EOF also hangs up."""
    poller = select.poll()
    poller.register(ctl.fileno(), select.POLLIN)
    return any(ev & (select.POLLHUP | select.POLLERR) for _, ev in poller.poll(0))


def main(ctl_fd: int) -> None:
    from suaveplan_sandbox.vm._guest import prepare_worker_interpreter
    from suaveplan_sandbox.vm._hardening import prepare_hardening

    ctl = socket.socket(fileno=ctl_fd)
    plan = prepare_hardening(RlimitSettings(address_space_bytes=None, cpu_seconds=None))
    prepare_worker_interpreter()  # preload facades, seal shared classes: once, not per fork
    cache: dict[str, CompiledBundle] = {}
    children: set[int] = set()
    # Wake select() on SIGCHLD without a handler racing the main loop.
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        ready, _, _ = select.select([ctl.fileno(), rfd], [], [], 1.0)
        if rfd in ready:
            os.read(rfd, 4096)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
            _send(ctl, {"op": "exited", "pid": pid, "status": status})
        if ctl.fileno() not in ready:
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(ctl, _MAX_REQUEST, 4)
        except OSError:
            return
        if not data and _peer_gone(ctl):
            for fd in fds:
                os.close(fd)
            return
        try:
            _serve_request(ctl, data, fds, cache, children, plan, (rfd, wfd))
        except Exception as exc:  # the zygote outlives any request: answer, clean up, go on
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            bad = exc if isinstance(exc, _BadRequest) else _BadRequest("internal")
            _send(ctl, {"op": "error", "id": bad.req_id, "code": _WIRE, "why": bad.why})


if __name__ == "__main__":
    main(int(sys.argv[1]))
