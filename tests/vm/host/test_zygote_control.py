"""The fork server's control channel from a hostile sender's side: it answers, it survives."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._guest import PluginBundle
from suaveplan_sandbox.vm._worker_loop import MAX_BUSY_POLL_US
from suaveplan_sandbox.vm._zygote import ForkServer


@pytest.fixture
def server() -> Iterator[ForkServer]:
    srv = ForkServer()  # a private zygote: the process-wide one stays untouched
    srv.ping()
    yield srv
    srv.shutdown()


def _raw(srv: ForkServer, data: bytes, fds: list[int] | None = None) -> dict[str, Any]:
    ctl = srv._ctl
    assert ctl is not None
    socket.send_fds(ctl, [data], fds or [])
    ctl.settimeout(10)
    while True:
        rep = msgpack.unpackb(ctl.recv(65536), raw=False)
        if rep.get("op") != "exited":
            return dict(rep)


MALFORMED = [
    pytest.param(b"\xc1", "undecodable", id="not-msgpack"),
    pytest.param(b"", "undecodable", id="empty"),  # SEQPACKET: an empty datagram, not EOF
    pytest.param(msgpack.packb([1, 2, 3]), "not-a-request", id="array"),
    pytest.param(msgpack.packb({"op": "ping"}), "bad-id", id="no-id"),
    pytest.param(msgpack.packb({"op": "ping", "id": "7"}), "bad-id", id="str-id"),
    pytest.param(msgpack.packb({"op": "nope", "id": 6}), "unknown-op", id="unknown-op"),
    pytest.param(msgpack.packb({"op": "fork", "id": 5}), "need-one-fd", id="fork-without-fd"),
    pytest.param(msgpack.packb({"op": "bare", "id": 5}), "need-one-fd", id="bare-without-fd"),
    pytest.param(
        msgpack.packb({"op": "load", "id": 7, "bundle": {"name": 1}}),
        "bundle:SAND_WIRE_ERROR",
        id="bad-bundle",
    ),
    pytest.param(msgpack.packb({"op": "load", "id": 7}), "bundle:SAND_WIRE_ERROR", id="no-bundle"),
    pytest.param(msgpack.packb({1: 2, "id": 3, "op": "ping"}), "undecodable", id="non-str-key"),
]


@pytest.mark.parametrize(("data", "why"), MALFORMED)
def test_a_malformed_control_request_gets_a_coded_error_and_the_zygote_keeps_serving(
    server: ForkServer, data: bytes, why: str
) -> None:
    pid = server.pid
    rep = _raw(server, data)
    assert rep["op"] == "error"
    assert rep["code"] == "SAND_WIRE_ERROR"
    assert rep["why"] == why
    assert server.ping() == pid
    assert server.starts == 1


@pytest.mark.parametrize(
    "req",
    [
        {"op": "fork", "id": 9, "digest": [1, 2]},
        {"op": "fork", "id": 9, "digest": "unknown"},
        {"op": "nope", "id": 9},
        {"op": "load", "id": 9, "bundle": None},
    ],
    ids=["unhashable-digest", "unknown-digest", "unknown-op", "load-with-fd"],
)
def test_fds_sent_with_a_rejected_request_are_closed_by_the_zygote(
    server: ForkServer, req: dict[str, object]
) -> None:
    ours, theirs = socket.socketpair()
    try:
        rep = _raw(server, msgpack.packb(req), [theirs.fileno()])
        theirs.close()
        assert rep["op"] == "error"
        assert rep["id"] == 9
        # The zygote held the only other copy: closing it is EOF on our end.
        ours.settimeout(5)
        assert ours.recv(1) == b""
        assert server.ping() == server.pid
    finally:
        ours.close()
        theirs.close()


def test_fork_fields_of_the_wrong_shape_are_refused_before_forking(
    server: ForkServer, tmp_path: Any
) -> None:
    from suaveplan_sandbox.vm._guest import load_plugin

    (tmp_path / "p.py").write_text("def f():\n    return 1\n")
    bundle = load_plugin(tmp_path / "p.py")
    assert (
        _raw(server, msgpack.packb({"op": "load", "id": 1, "bundle": bundle.to_wire()}))["op"]
        == "loaded"
    )
    ok = [None, None]
    for rlimits, require, poll in [
        ("x", [], 0),
        ([1], [], 0),
        ([-1, None], [], 0),
        ([None, None], [3], 0),
        (ok, [], -1),
        (ok, [], MAX_BUSY_POLL_US + 1),
        (ok, [], 1.5),
        (ok, [], "100"),
        (ok, [], True),
    ]:
        ours, theirs = socket.socketpair()
        req = {"op": "fork", "id": 2, "digest": bundle.digest, "rlimits": rlimits}
        req["require"] = require
        req["busy_poll_us"] = poll
        rep = _raw(server, msgpack.packb(req), [theirs.fileno()])
        theirs.close()
        ours.close()
        assert (rep["op"], rep["why"]) == ("error", "bad-fork-fields")
    assert server.live == set()
    assert server.ping() == server.pid


@pytest.mark.parametrize(
    ("op", "second", "why"),
    [("fork", "socket", "bad-lifeline"), ("bare", "pipe", "need-one-fd")],
    ids=["lifeline-not-a-pipe", "bare-with-a-lifeline"],
)
def test_a_lifeline_must_be_a_pipe_and_only_a_fork_takes_one(
    server: ForkServer, op: str, second: str, why: str
) -> None:
    import os

    ours, theirs = socket.socketpair()
    extra_ours, extra_theirs = socket.socketpair()
    r, w = os.pipe()
    extra = extra_theirs.fileno() if second == "socket" else r
    try:
        rep = _raw(server, msgpack.packb({"op": op, "id": 4}), [theirs.fileno(), extra])
        assert (rep["op"], rep["why"]) == ("error", why)
        assert server.live == set()
        assert server.ping() == server.pid
    finally:
        for sock in (ours, theirs, extra_ours, extra_theirs):
            sock.close()
        os.close(r)
        os.close(w)


def test_a_bare_fork_reports_ready_through_the_same_zygote(server: ForkServer) -> None:
    ours, theirs = socket.socketpair()
    try:
        pid = server.fork_bare(theirs)
        theirs.close()
        ours.settimeout(5)
        assert ours.recv(1) == b"r"
        assert pid in server.live
    finally:
        ours.close()
        theirs.close()


def test_a_malformed_bundle_is_a_wire_error_not_a_result_error() -> None:
    with pytest.raises(SuaveplanError) as info:
        PluginBundle.from_wire({"name": "x", "digest": 1, "entry": "x", "modules": []})
    assert info.value.code == "SAND_WIRE_ERROR"
    assert info.value.details == {"reason": "bad-bundle"}


def test_the_zygote_still_ends_on_eof_of_its_control_socket() -> None:
    srv = ForkServer()
    srv.ping()
    proc, ctl = srv._proc, srv._ctl
    assert proc is not None
    assert ctl is not None
    ctl.close()
    assert proc.wait(timeout=10) == 0
    srv._ctl = None
    srv.shutdown()


def test_a_zygote_dead_but_not_yet_reaped_is_restarted_and_the_fork_retried(
    tmp_path: Any,
) -> None:
    import os
    import signal
    import time

    import psutil

    from suaveplan_sandbox.vm._guest import load_plugin

    (tmp_path / "p.py").write_text("def f():\n    return 1\n")
    bundle = load_plugin(tmp_path / "p.py")
    srv = ForkServer()
    try:
        srv.ping()
        proc = srv._proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGKILL)
        for _ in range(500):
            if psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.01)
        # The host has not reaped it yet: it still looks alive, so the request is sent to it.
        proc.poll = lambda: None  # type: ignore[method-assign]
        ours, theirs = socket.socketpair()
        try:
            pid = srv.fork(bundle, theirs, rlimits=(None, None), require=())
        finally:
            theirs.close()
        assert srv.starts == 2
        assert pid in srv.live
        ours.close()
    finally:
        srv.shutdown()


def test_the_fork_server_and_its_children_have_a_session_and_group_of_their_own(
    server: ForkServer,
) -> None:
    # A child signalling its process group (kill(0, ...)) must never reach the host, whatever
    # layer is missing; nor does the terminal's Ctrl-C reach the fork server past the host.
    zygote = server.pid
    assert zygote is not None
    ours, theirs = socket.socketpair()
    try:
        child = server.fork_bare(theirs)
        ours.settimeout(10)
        assert ours.recv(1) == b"r"  # running: it reports ready and waits for EOF
        host_group, host_session = os.getpgid(0), os.getsid(0)
        assert os.getsid(zygote) == zygote != host_session
        assert os.getpgid(zygote) == zygote != host_group
        assert os.getpgid(child) == zygote
        assert os.getsid(child) == zygote
    finally:
        ours.close()
        theirs.close()


def _open_files(srv: ForkServer) -> list[str]:
    proc = f"/proc/{srv.pid}/fd"
    return [os.readlink(f"{proc}/{name}") for name in os.listdir(proc)]


def _bundle_request(size: int) -> bytes:
    packed: bytes = msgpack.packb({"op": "load", "id": 4, "bundle_bytes": size})
    return packed


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("test-bundle")
    os.write(fd, data)
    return fd


@pytest.mark.parametrize(
    ("declared", "content", "why"),
    [
        (10, b"0123456789", "bundle:SAND_WIRE_ERROR"),  # not msgpack
        (11, b"0123456789", "bad-bundle-fd"),  # shorter than declared
        (0, b"", "bad-bundle-size"),
        (9 * 1024 * 1024, b"x", "bad-bundle-size"),  # over the request limit
        (5, msgpack.packb({"name": 1}), "bad-bundle-fd"),  # size differs
    ],
    ids=["undecodable", "short", "empty", "too-large", "size-mismatch"],
)
def test_a_bundle_in_an_fd_that_does_not_match_its_request_is_refused_and_the_fd_closed(
    server: ForkServer, declared: int, content: bytes, why: str
) -> None:
    fd = _memfd(content)
    try:
        rep = _raw(server, _bundle_request(declared), [fd])
        assert (rep["op"], rep["why"]) == ("error", why)
        assert "/memfd:test-bundle (deleted)" not in _open_files(server)  # its copy closed
        assert server.ping() == server.pid
        assert server.starts == 1
    finally:
        os.close(fd)


def test_a_bundle_request_without_its_fd_or_with_a_pipe_is_refused(server: ForkServer) -> None:
    assert _raw(server, _bundle_request(10))["why"] == "need-one-fd"
    r, w = os.pipe()
    try:
        os.write(w, b"0123456789")
        assert _raw(server, _bundle_request(10), [r])["why"] == "bad-bundle-fd"
    finally:
        os.close(r)
        os.close(w)
    assert server.ping() == server.pid


def test_a_plugin_larger_than_one_control_datagram_loads_and_answers(tmp_path: Any) -> None:
    # A 3 MB source: its bundle goes to the fork server in a memfd (a SEQPACKET datagram is
    # bounded by the socket's send buffer, about 208 KiB by default).
    from suaveplan_sandbox.permissions import PermissionPolicy
    from suaveplan_sandbox.vm import create_vm_sandbox_sync

    (tmp_path / "big.py").write_text(
        "DATA = " + repr("x" * 3_000_000) + "\n\ndef size():\n    return len(DATA)\n"
    )
    policy = PermissionPolicy.from_manifest({"name": "big", "version": "1.0.0"}, root=tmp_path)
    with create_vm_sandbox_sync(plugin_module_path=str(tmp_path / "big.py"), policy=policy) as sb:
        assert sb.call("size") == 3_000_000
