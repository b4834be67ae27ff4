"""A forked worker never comes back into the fork server's loop, and a request for an unknown
hardening layer is refused before anything forks."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._guest import load_plugin
from suaveplan_sandbox.vm._zygote import ForkServer

# Runs `_dispatch` of a `fork` request in a fresh interpreter with a worker body that raises.
# The child must end with exit status 2 right there; if the exception came back out of
# `_dispatch`, the child would be running this script (the zygote's loop in real life), as
# an unhardened second fork server holding the control socket.
_ESCAPE = r"""
import os, socket, sys
from suaveplan_sandbox.vm import _zygote_main as zm
from suaveplan_sandbox.vm._guest import compile_bundle, load_plugin
from suaveplan_sandbox.vm._hardening import RlimitSettings, prepare_hardening

def boom(*args, **kwargs):
    raise RuntimeError("worker body failed")

zm._child = boom
bundle = load_plugin(sys.argv[1])
cache = {bundle.digest: compile_bundle(bundle)}
ctl, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
ours, theirs = socket.socketpair()
wake = os.pipe()
children = set()
parent = os.getpid()
req = {"op": "fork", "id": 1, "digest": bundle.digest, "rlimits": [None, None], "require": []}
plan = prepare_hardening(RlimitSettings(address_space_bytes=None, cpu_seconds=None))
try:
    zm._dispatch(ctl, 1, req, [theirs.fileno()], cache, children, plan, wake)
except BaseException as exc:
    if os.getpid() != parent:
        print("ESCAPED", type(exc).__name__, flush=True)
        os._exit(0)
    raise
(pid,) = children
_, status = os.waitpid(pid, 0)
print("STATUS", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_an_exception_in_the_forked_child_ends_the_child_not_returns_to_the_loop(
    tmp_path: Path,
) -> None:
    (tmp_path / "p.py").write_text("def f():\n    return 1\n")
    out = subprocess.run(
        [sys.executable, "-c", _ESCAPE, str(tmp_path / "p.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "ESCAPED" not in out.stdout, out.stdout
    assert out.stdout.strip().splitlines() == ["STATUS 2"], (out.stdout, out.stderr)


@pytest.fixture
def server() -> Any:
    srv = ForkServer()  # a private zygote: the process-wide one stays untouched
    srv.ping()
    yield srv
    srv.shutdown()


def test_the_zygote_refuses_a_fork_requiring_an_unknown_layer(
    server: ForkServer, tmp_path: Path
) -> None:
    (tmp_path / "p.py").write_text("def f():\n    return 1\n")
    bundle = load_plugin(tmp_path / "p.py")
    ctl = server._ctl
    assert ctl is not None
    ctl.settimeout(10)

    def raw(req: dict[str, object], fds: list[int]) -> dict[str, Any]:
        socket.send_fds(ctl, [msgpack.packb(req)], fds)
        while True:
            rep = msgpack.unpackb(ctl.recv(65536), raw=False)
            if rep.get("op") != "exited":
                return dict(rep)

    assert raw({"op": "load", "id": 1, "bundle": bundle.to_wire()}, [])["op"] == "loaded"
    ours, theirs = socket.socketpair()
    try:
        rep = raw(
            {
                "op": "fork",
                "id": 2,
                "digest": bundle.digest,
                "rlimits": [None, None],
                "require": ["seccomp", "sekcomp"],
            },
            [theirs.fileno()],
        )
    finally:
        theirs.close()
        ours.close()
    assert (rep["op"], rep["why"]) == ("error", "bad-fork-fields")
    assert server.live == set()
    assert server.ping() == server.pid


def test_the_host_refuses_an_unknown_required_layer_before_asking_the_zygote(
    server: ForkServer, tmp_path: Path
) -> None:
    (tmp_path / "p.py").write_text("def f():\n    return 1\n")
    bundle = load_plugin(tmp_path / "p.py")
    ours, theirs = socket.socketpair()
    try:
        with pytest.raises(SuaveplanError) as info:
            server.fork(bundle, theirs, rlimits=(None, None), require=("landlock",))
    finally:
        ours.close()
        theirs.close()
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details["layers"] == ["landlock"]
    assert server._loaded == set()  # nothing was sent, not even the bundle
    assert server.live == set()


def test_create_vm_sandbox_with_a_misspelt_required_layer_is_an_invalid_argument(
    tmp_path: Path,
) -> None:
    (tmp_path / "p.py").write_text("def f():\n    return 1\n")
    policy = PermissionPolicy.from_manifest({"name": "typo"}, root=tmp_path)

    async def main() -> str:
        with pytest.raises(SuaveplanError) as info:
            await create_vm_sandbox(
                plugin_module_path=tmp_path / "p.py",
                policy=policy,
                require_hardening=("seccomp", "landlock-fs"),
            )
        return info.value.code

    assert asyncio.run(main()) == "SAND_INVALID_ARGUMENT"
