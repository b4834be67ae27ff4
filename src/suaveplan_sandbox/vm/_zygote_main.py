"""Fork server (zygote) entry point: `python -I -S -c <bootstrap> <sys.path json>`.

Single-threaded. Reads requests from the control SEQPACKET socket (fd 3 in its argv):
`load` caches a compiled bundle by digest; `fork` (with one socket fd via SCM_RIGHTS) forks a
worker that hardens itself, keeps only that fd and serves calls. Children are reaped with
waitpid(WNOHANG) on every wake-up and reported as `exited`. EOF on the control socket ends
the zygote and, through the worker sockets' owner (the host), nothing else.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
from typing import Any

import msgpack

_MAX_REQUEST = 8 * 1024 * 1024


def _send(ctl: socket.socket, obj: dict[str, Any]) -> None:
    try:
        ctl.send(msgpack.packb(obj, use_bin_type=True))
    except OSError:
        raise SystemExit(0) from None


def _child(
    ctl: socket.socket,
    wsock: socket.socket,
    compiled: Any,
    plan: Any,
    req: dict[str, Any],
) -> None:
    from suaveplan_sandbox.errors import SuaveplanError
    from suaveplan_sandbox.protocol import Failure, encode
    from suaveplan_sandbox.vm._hardening import RlimitSettings, apply_hardening
    from suaveplan_sandbox.vm._worker_loop import serve

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    ctl.close()
    rl = req["rlimits"]
    rlimits = RlimitSettings(address_space_bytes=rl[0], cpu_seconds=rl[1])
    try:
        report = apply_hardening(
            plan, keep_fds=(wsock.fileno(),), rlimits=rlimits, require=tuple(req["require"])
        )
    except SuaveplanError as exc:
        wsock.sendall(encode(Failure(id=0, error=exc.to_wire())))  # type: ignore[arg-type]
        os._exit(0)
    try:
        serve(wsock, compiled, report.to_wire(), process_probe=bool(req.get("probe")))
    except SystemExit as exc:
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    except BaseException:
        os._exit(2)


def main(ctl_fd: int) -> None:
    from suaveplan_sandbox.vm._guest import PluginBundle, compile_bundle
    from suaveplan_sandbox.vm._hardening import RlimitSettings, prepare_hardening

    ctl = socket.socket(fileno=ctl_fd)
    plan = prepare_hardening(RlimitSettings(address_space_bytes=None, cpu_seconds=None))
    cache: dict[str, Any] = {}
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
        if not data:
            for fd in fds:
                os.close(fd)
            return
        req = msgpack.unpackb(data, raw=False)
        if req["op"] == "load":
            bundle = PluginBundle.from_wire(req["bundle"])
            if bundle.digest not in cache:
                cache[bundle.digest] = compile_bundle(bundle)
            _send(ctl, {"op": "loaded", "id": req["id"]})
        elif req["op"] == "fork":
            compiled = cache.get(req["digest"])
            if compiled is None or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                _send(ctl, {"op": "error", "id": req["id"], "why": "unknown-digest"})
                continue
            wsock = socket.socket(fileno=fds[0])
            pid = os.fork()
            if pid == 0:
                os.close(rfd)
                os.close(wfd)
                signal.set_wakeup_fd(-1)
                _child(ctl, wsock, compiled, plan, req)
                os._exit(0)
            wsock.close()
            children.add(pid)
            _send(ctl, {"op": "forked", "id": req["id"], "pid": pid})
        elif req["op"] == "ping":
            _send(ctl, {"op": "pong", "id": req["id"], "pid": os.getpid()})


if __name__ == "__main__":
    main(int(sys.argv[1]))
