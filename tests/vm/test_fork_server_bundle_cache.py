"""The fork server keeps a bounded number of compiled bundles; the host reloads one it
dropped, so a long-lived host cycling through plugin versions neither grows the zygote
without bound nor fails a create."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from suaveplan_sandbox.vm import _zygote_main
from suaveplan_sandbox.vm._guest import PluginBundle, load_plugin
from suaveplan_sandbox.vm._zygote import ForkServer

BOUND = _zygote_main._MAX_COMPILED


@pytest.fixture
def server() -> Iterator[ForkServer]:
    srv = ForkServer()  # a private zygote: the process-wide one stays untouched
    srv.ping()
    yield srv
    srv.shutdown()


def _raw(srv: ForkServer, req: dict[str, object], fds: list[int] | None = None) -> dict[str, Any]:
    ctl = srv._ctl
    assert ctl is not None
    socket.send_fds(ctl, [msgpack.packb(req)], fds or [])
    ctl.settimeout(10)
    while True:
        rep = msgpack.unpackb(ctl.recv(65536), raw=False)
        if rep.get("op") != "exited":
            return dict(rep)


def _bundles(tmp_path: Path, n: int) -> list[PluginBundle]:
    out = []
    for i in range(n):
        path = tmp_path / f"p{i}.py"
        path.write_text(f"def f():\n    return {i}\n")
        out.append(load_plugin(path))
    return out


def _raw_fork(srv: ForkServer, bundle: PluginBundle) -> dict[str, Any]:
    ours, theirs = socket.socketpair()
    try:
        req = {
            "op": "fork",
            "id": 99,
            "digest": bundle.digest,
            "rlimits": [None, None],
            "require": [],
        }
        return _raw(srv, req, [theirs.fileno()])
    finally:
        theirs.close()
        ours.close()  # a forked worker reads EOF and exits


def _load(srv: ForkServer, bundle: PluginBundle) -> None:
    assert _raw(srv, {"op": "load", "id": 1, "bundle": bundle.to_wire()})["op"] == "loaded"


def test_the_zygote_keeps_only_its_most_recently_used_bundles(
    server: ForkServer, tmp_path: Path
) -> None:
    bundles = _bundles(tmp_path, BOUND + 2)
    for b in bundles[:BOUND]:
        _load(server, b)
    assert _raw_fork(server, bundles[0])["op"] == "forked"  # used: now the most recent
    _load(server, bundles[BOUND])
    _load(server, bundles[BOUND + 1])
    # bundles[1] and [2] were the least recently used; [0] was used since they were loaded.
    assert _raw_fork(server, bundles[1])["why"] == "unknown-digest"
    assert _raw_fork(server, bundles[2])["why"] == "unknown-digest"
    for b in (bundles[0], bundles[3], bundles[BOUND + 1]):
        assert _raw_fork(server, b)["op"] == "forked"
    assert server.ping() == server.pid


def test_the_host_reloads_a_bundle_the_zygote_dropped(server: ForkServer, tmp_path: Path) -> None:
    bundles = _bundles(tmp_path, BOUND + 1)

    def fork(bundle: PluginBundle) -> int:
        ours, theirs = socket.socketpair()
        try:
            pid = server.fork(bundle, theirs, rlimits=(None, None), require=())
        finally:
            theirs.close()
            ours.close()
        return pid

    fork(bundles[0])
    assert bundles[0].digest in server._loaded
    for b in bundles[1:]:
        _load(server, b)  # behind the host's back: bundles[0] falls out of the zygote
    assert _raw_fork(server, bundles[0])["why"] == "unknown-digest"
    assert fork(bundles[0]) in server.live  # the host's hint was stale: it loaded again
    assert server.starts == 1


def test_exit_notices_are_kept_for_the_most_recent_workers_only() -> None:
    # A long-lived host creates and disposes sandboxes without end: the exit status of every
    # worker it ever had must not stay in memory for the life of the process.
    from suaveplan_sandbox.vm import _zygote

    server = _zygote.ForkServer()
    try:
        server.ping()
        chan = server._chan
        assert chan is not None
        total = _zygote.MAX_EXITED + 50
        with server._lock:
            for pid in range(1, total + 1):
                server._file(chan, msgpack.packb({"op": "exited", "pid": pid, "status": 0}))
        assert len(server.exited) == _zygote.MAX_EXITED
        assert min(server.exited) == total - _zygote.MAX_EXITED + 1  # the oldest went first
        assert max(server.exited) == total
    finally:
        server.shutdown()
