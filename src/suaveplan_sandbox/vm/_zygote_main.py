"""Fork server (zygote) entry point: `python -I -S -c <bootstrap> <sys.path json>`.

Single-threaded. Reads requests from the control SEQPACKET socket (fd 3 in its argv):
`load` caches a compiled bundle by digest (the `_MAX_COMPILED` most recently used: a
long-lived host cycling through plugin versions must not grow the zygote, and with it
every fork's page tables, without bound; a `fork` of a dropped digest is answered
`unknown-digest` and the host loads it again). A bundle not cached is checked and compiled
in a short-lived child with capped memory and CPU (`_compile_child`), never in the zygote
itself: parsing costs hundreds of times the source's size, and every worker would inherit
the zygote's peak. The zygote does not wait for that child: it starts it, watches its reply
pipe in the same `select` as the control socket, and answers `loaded`, or `refused` with the
plugin's coded error, when the child is done, serving every other request meanwhile (one
tenant's upload that burns its child's whole CPU limit must not stall everyone's creates).
At most `_MAX_COMPILING` children run at once; further loads queue in arrival order, and
loads of a bundle already queued or compiling (same digest and memory limit) wait for the
same child. A cached bundle costs no child, nor does a refusal remembered by digest (the
`_MAX_REFUSED` most recent, only those that depend on the source alone:
`depends_on_source_alone`). `fork` (with one socket fd via SCM_RIGHTS) forks a worker that
hardens itself, keeps only that fd and serves calls; `bare` forks a child that only writes
one byte (the benchmark's baseline for a fork through this server); `ping` answers its pid,
how many compile children it forked, how many run, how many loads are queued and how many
load requests wait for an answer. A request that is malformed in any way (bytes, shape,
fields, fds) is answered `{"op": "error", "code": "SAND_WIRE_ERROR", "why": ...}` and the
zygote keeps serving. Replies are queued and sent as the host's socket takes them, never
blocking the loop (a host sending several requests while its socket is full of `exited`
notices would otherwise wait on a zygote waiting on it).
Children are reaped with wait4(WNOHANG) on every wake-up: workers are reported as `exited`,
compile children are handed their wait status and resource usage, never reported.

Nothing outlives the host. EOF on the control socket (the host exited or was SIGKILLed; the
kernel closes its end) ends the zygote, which kills its compile children first. Each compile
child also arms a lifeline pipe whose only write end the zygote holds, so it dies with the
zygote however the zygote ends. A `fork` may carry a second fd, the read end of a
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
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

import msgpack

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.protocol import Failure, encode
from suaveplan_sandbox.vm import _compile_child
from suaveplan_sandbox.vm._compile_child import (
    DEFAULT_COMPILE_MEMORY_MB,
    MAX_COMPILE_MEMORY_MB,
    MIN_COMPILE_MEMORY_MB,
    CompileChild,
    CompileLimits,
    depends_on_source_alone,
    refusal_wire,
    start_compile,
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
# Refusals remembered by digest; each is a small map (`refusal_wire` caps it at 16 KiB).
_MAX_REFUSED: Final = 128
# Compile children running at once. Each may map 1 GiB beyond the zygote by default (a load
# may ask for up to `MAX_COMPILE_MEMORY_MB`) and burn a whole core for 30 s: two keep one
# hostile upload from holding every load (the next plugin gets the other child) while
# compiles can take at most two cores and, by default, 2 GiB of the machine whatever the
# number of tenants uploading at once. Loads beyond it queue here in arrival order.
_MAX_COMPILING: Final = 2
_SIGCHLD: Final = int(signal.SIGCHLD)
_MB: Final = 1024 * 1024

# Replies and notices not yet taken by the host's socket, oldest first (one control socket
# per zygote process). See `_flush`.
_outbox: deque[bytes] = deque()


def _send(ctl: socket.socket, obj: dict[str, Any]) -> None:
    _outbox.append(msgpack.packb(obj, use_bin_type=True))
    _flush(ctl)


def _flush(ctl: socket.socket) -> None:
    """Send what the host's socket takes now; the rest waits for the loop to find it
    writable. Never blocks: a zygote blocked on a host that is itself blocked sending it
    requests would be a deadlock."""
    while _outbox:
        try:
            ctl.send(_outbox[0], socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            raise SystemExit(0) from None
        _outbox.popleft()


@dataclass(frozen=True, slots=True)
class _Worker:
    """One validated `fork` request, built before the fork (see the module docstring)."""

    compiled: CompiledBundle
    rlimits: RlimitSettings
    require: tuple[str, ...]
    keep_fds: tuple[int, ...]
    probe: bool
    busy_poll_s: float


@dataclass(slots=True, eq=False)
class _Load:
    """The loads of one bundle under one memory limit: queued, then compiling in `child`;
    every waiting request gets the one answer."""

    bundle: PluginBundle
    memory_mb: int
    waiters: list[int]
    child: CompileChild | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.bundle.digest, self.memory_mb)


@dataclass(slots=True, eq=False)
class _Compiles:
    """The zygote's compile work: refusals it remembers, loads queued and compiling."""

    refused: dict[str, dict[str, object]] = field(default_factory=dict)
    loads: dict[tuple[str, int], _Load] = field(default_factory=dict)  # queued or compiling
    queue: deque[_Load] = field(default_factory=deque)
    running: dict[int, _Load] = field(default_factory=dict)  # by compile child's pid

    def private_fds(self) -> tuple[int, ...]:
        """The running children's open pipe ends, which no other child of the zygote may
        keep (a worker holding a compile child's lifeline would keep that child alive past
        the zygote). Taken fresh for each fork: a number closed since may be reused."""
        return tuple(fd for load in self.running.values() if load.child for fd in load.child.fds)

    def reading(self) -> dict[int, CompileChild]:
        return {c.reply_fd: c for load in self.running.values() if (c := load.child) and c.reading}

    def next_deadline(self) -> float | None:
        deadlines = [
            c.deadline
            for load in self.running.values()
            if (c := load.child) and c.exit is None and c.stopped is None
        ]
        return min(deadlines, default=None)

    def waiting(self) -> int:
        return sum(len(load.waiters) for load in self.loads.values())

    def kill_all(self) -> None:
        for load in self.running.values():
            if load.child is not None and load.child.exit is None:
                with contextlib.suppress(OSError):
                    os.kill(load.child.pid, signal.SIGKILL)


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
    private: tuple[int, ...] = (),
) -> NoReturn:
    """The forked child's whole life. It never returns: an exception let back into the
    zygote's loop would have this unhardened copy answer (and read) the control socket as a
    second fork server. `private`: the compile children's pipes, closed first."""
    try:
        if lifeline >= 0:
            arm_lifeline(lifeline)  # first: from here on the worker dies with its host
        os.close(wake[0])
        os.close(wake[1])
        for fd in private:
            os.close(fd)
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
    compiles: _Compiles,
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
        _dispatch(ctl, req_id, req, fds, cache, children, plan, wake, compiles)
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


def _hold(cache: dict[str, CompiledBundle], compiled: CompiledBundle) -> None:
    cache.pop(compiled.digest, None)
    cache[compiled.digest] = compiled  # most recently used: last
    while len(cache) > _MAX_COMPILED:
        del cache[next(iter(cache))]


def _answer_known(
    ctl: socket.socket,
    digest: str,
    waiters: list[int],
    cache: dict[str, CompiledBundle],
    compiles: _Compiles,
) -> bool:
    """Answer `waiters` from what the zygote holds for `digest`, compiled or refused (and
    mark it most recently used); False if it holds nothing."""
    compiled = cache.get(digest)
    if compiled is not None:
        _hold(cache, compiled)
        for req_id in waiters:
            _send(ctl, {"op": "loaded", "id": req_id})
        return True
    refusal = compiles.refused.pop(digest, None)
    if refusal is None:
        return False
    compiles.refused[digest] = refusal  # most recently used: last
    for req_id in waiters:
        _send(ctl, {"op": "refused", "id": req_id, "error": refusal})
    return True


def _start_queued(
    ctl: socket.socket,
    cache: dict[str, CompiledBundle],
    plan: HardeningPlan,
    wake: tuple[int, int],
    compiles: _Compiles,
) -> None:
    """Start queued loads, oldest first, while fewer than `_MAX_COMPILING` children run."""
    while compiles.queue and len(compiles.running) < _MAX_COMPILING:
        load = compiles.queue.popleft()
        # Compiled or refused meanwhile (under another memory limit): no child needed.
        if _answer_known(ctl, load.bundle.digest, load.waiters, cache, compiles):
            del compiles.loads[load.key]
            continue
        limits = CompileLimits(memory_bytes=load.memory_mb * _MB)
        try:
            child = start_compile(
                load.bundle,
                limits,
                plan=plan,
                close_in_child=(ctl.fileno(), *wake, *compiles.private_fds()),
            )
        except Exception as exc:  # OSError: no fork or pipe to be had
            del compiles.loads[load.key]
            why = "compile-fork-failed" if isinstance(exc, OSError) else "internal"
            for req_id in load.waiters:
                _send(ctl, _error(req_id, why))
            continue
        load.child = child
        compiles.running[child.pid] = load


def _error(req_id: int | None, why: str) -> dict[str, Any]:
    return {"op": "error", "id": req_id, "code": _WIRE, "why": why}


def _answer_finished(
    ctl: socket.socket,
    cache: dict[str, CompiledBundle],
    plan: HardeningPlan,
    wake: tuple[int, int],
    compiles: _Compiles,
) -> None:
    """Answer the loads whose compile child is done (read to the end and reaped), then give
    the freed places to queued loads."""
    for pid, load in list(compiles.running.items()):
        child = load.child
        if child is None or not child.done:
            continue
        del compiles.running[pid]
        del compiles.loads[load.key]
        try:
            child.close()
            reply = _verdict(child, cache, compiles)
        except Exception:  # the zygote outlives any compile: its waiters get an error
            reply = {"op": "error", "code": _WIRE, "why": "internal"}
        for req_id in load.waiters:
            _send(ctl, {**reply, "id": req_id})
    _start_queued(ctl, cache, plan, wake, compiles)


def _verdict(
    child: CompileChild, cache: dict[str, CompiledBundle], compiles: _Compiles
) -> dict[str, Any]:
    """The answer for a finished compile child's loads; what it compiled is cached, and a
    refusal that depends on the source alone is remembered."""
    try:
        compiled = child.outcome()
    except SuaveplanError as exc:  # the plugin's verdict
        wire = refusal_wire(exc)
        if depends_on_source_alone(exc):
            digest = child.bundle.digest
            compiles.refused.pop(digest, None)
            compiles.refused[digest] = wire  # most recently used: last
            while len(compiles.refused) > _MAX_REFUSED:
                del compiles.refused[next(iter(compiles.refused))]
        return {"op": "refused", "error": wire}
    _hold(cache, compiled)
    return {"op": "loaded"}


def _load(  # noqa: PLR0917
    ctl: socket.socket,
    req_id: int,
    req: dict[Any, Any],
    fds: list[int],
    cache: dict[str, CompiledBundle],
    plan: HardeningPlan,
    wake: tuple[int, int],
    compiles: _Compiles,
) -> None:
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
    if _answer_known(ctl, bundle.digest, [req_id], cache, compiles):
        return
    pending = compiles.loads.get((bundle.digest, memory_mb))
    if pending is not None:  # queued or compiling already: it answers this one too
        pending.waiters.append(req_id)
        return
    load = _Load(bundle, memory_mb, [req_id])
    compiles.loads[load.key] = load
    compiles.queue.append(load)
    _start_queued(ctl, cache, plan, wake, compiles)


def _dispatch(  # noqa: PLR0917
    ctl: socket.socket,
    req_id: int,
    req: dict[Any, Any],
    fds: list[int],
    cache: dict[str, CompiledBundle],
    children: set[int],
    plan: HardeningPlan,
    wake: tuple[int, int],
    compiles: _Compiles | None = None,
) -> None:
    compiles = compiles if compiles is not None else _Compiles()
    op = req.get("op")
    if op == "load":
        _load(ctl, req_id, req, fds, cache, plan, wake, compiles)
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
        private = compiles.private_fds()  # here: the child's path is kept short
        try:
            pid = os.fork()
        except OSError as exc:
            wsock.close()
            raise _BadRequest("fork-failed", req_id) from exc
        if pid == 0:
            _run_child(ctl, wsock, lifeline, wake, plan, job, private)
        wsock.close()
        if lifeline >= 0:
            os.close(lifeline)
        children.add(pid)
        _send(ctl, {"op": "forked", "id": req_id, "pid": pid})
    elif op == "ping":
        _send(
            ctl,
            {
                "op": "pong",
                "id": req_id,
                "pid": os.getpid(),
                "compiles": _compile_child.forked_total,
                "compiling": len(compiles.running),
                "queued": len(compiles.queue),
                "waiting": compiles.waiting(),
            },
        )
    else:
        raise _BadRequest("unknown-op", req_id)


def _peer_gone(ctl: socket.socket) -> bool:
    """SEQPACKET reads 0 bytes for an empty datagram and for EOF; only EOF also hangs up."""
    poller = select.poll()
    poller.register(ctl.fileno(), select.POLLIN)
    return any(ev & (select.POLLHUP | select.POLLERR) for _, ev in poller.poll(0))


def _reap(ctl: socket.socket, children: set[int], compiles: _Compiles) -> None:
    """Reap every child that ended: a compile child gets its status and usage (its load is
    answered from them), any other is reported to the host as `exited`."""
    while children or compiles.running:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            for lost in compiles.running.values():
                if lost.child is not None and lost.child.exit is None:
                    lost.child.lost()
            return
        if pid == 0:
            return
        load = compiles.running.get(pid)
        if load is not None and load.child is not None:
            load.child.reaped(status, usage)
            continue
        children.discard(pid)
        _send(ctl, {"op": "exited", "pid": pid, "status": status})


def main(ctl_fd: int) -> None:
    from suaveplan_sandbox.vm._guest import prepare_worker_interpreter
    from suaveplan_sandbox.vm._hardening import prepare_hardening

    ctl = socket.socket(fileno=ctl_fd)
    plan = prepare_hardening(RlimitSettings(address_space_bytes=None, cpu_seconds=None))
    prepare_worker_interpreter()  # preload facades, seal shared classes: once, not per fork
    compiles = _Compiles()
    try:
        _serve(ctl, plan, compiles)
    finally:
        compiles.kill_all()  # their lifelines would end them too, as this process exits


def _serve(ctl: socket.socket, plan: HardeningPlan, compiles: _Compiles) -> None:
    cache: dict[str, CompiledBundle] = {}
    children: set[int] = set()
    # Wake select() on SIGCHLD without a handler racing the main loop.
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    wake = (rfd, wfd)
    ctl_fd = ctl.fileno()
    while True:
        reading = compiles.reading()
        timeout = 1.0
        deadline = compiles.next_deadline()
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - time.monotonic()))
        ready, writable, _ = select.select(
            [ctl_fd, rfd, *reading], [ctl_fd] if _outbox else [], [], timeout
        )
        if rfd in ready:
            os.read(rfd, 4096)
        _reap(ctl, children, compiles)
        for fd in ready:
            if fd in reading:
                reading[fd].read()
        now = time.monotonic()
        for load in compiles.running.values():
            if load.child is not None:
                load.child.expire(now)
        _answer_finished(ctl, cache, plan, wake, compiles)
        if writable:
            _flush(ctl)
        if ctl_fd not in ready:
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
            _serve_request(ctl, data, fds, cache, children, plan, wake, compiles)
        except Exception as exc:  # the zygote outlives any request: answer, clean up, go on
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            bad = exc if isinstance(exc, _BadRequest) else _BadRequest("internal")
            _send(ctl, _error(bad.req_id, bad.why))


if __name__ == "__main__":
    main(int(sys.argv[1]))
