"""Host robustness: nothing outlives a killed host, a finite CPU rlimit in every real worker,
and a bounded record of denials."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from _forking import fork
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._guest import load_plugin
from suaveplan_sandbox.vm._hardening import arm_lifeline
from suaveplan_sandbox.vm._sandbox import DEFAULT_CPU_BACKSTOP_S, MAX_RECORDED_DENIALS
from suaveplan_sandbox.vm._zygote import ForkServer

SPIN = "def spin():\n    while True:\n        pass\n\ndef noop():\n    return None\n"

# A host in its own interpreter: one sandbox, one busy call, then it waits to be killed.
HOST = """
import asyncio, json, sys
from pathlib import Path
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._zygote import fork_server

async def main():
    root = Path(sys.argv[1])
    policy = PermissionPolicy.from_manifest({"name": "orphan"}, root=root)
    sb = await create_vm_sandbox(plugin_module_path=root / "plugin.py", policy=policy)
    busy = asyncio.ensure_future(sb.call("spin"))
    await asyncio.sleep(0.05)
    print(json.dumps({"zygote": fork_server().pid, "worker": sb.pid}), flush=True)
    await busy

asyncio.run(main())
"""


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if not _gone(p)]
        if not alive:
            return []
        time.sleep(0.02)
    return [p for p in pids if not _gone(p)]


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_sigkilled_host_takes_its_fork_server_and_busy_worker_with_it(tmp_path: Path) -> None:
    (tmp_path / "plugin.py").write_text(SPIN)
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, str(tmp_path)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        assert host.stdout is not None
        line = host.stdout.readline()
        assert line, "the host did not start its sandbox"
        info = json.loads(line)
        zygote, worker = int(info["zygote"]), int(info["worker"])
        pids = [zygote, worker]
        # Preconditions: the worker is the zygote's child, the zygote the host's, and busy.
        assert psutil.Process(worker).ppid() == zygote
        assert psutil.Process(zygote).ppid() == host.pid
        start = psutil.Process(worker).cpu_times()
        time.sleep(0.2)
        now = psutil.Process(worker).cpu_times()
        assert (now.user + now.system) > (start.user + start.system)
        host.send_signal(signal.SIGKILL)
        host.wait(timeout=10)
        assert _wait_gone(pids, timeout=10.0) == []
    finally:
        host.kill()
        host.wait()
        _kill_all([p for p in pids if not _gone(p)])


def test_closing_the_lifeline_kills_a_busy_worker_that_outlives_its_fork_server(
    tmp_path: Path,
) -> None:
    from suaveplan_sandbox.protocol import Call, encode

    (tmp_path / "p.py").write_text(SPIN)
    bundle = load_plugin(tmp_path / "p.py")
    srv = ForkServer()  # a private zygote: the process-wide one stays untouched
    ours, theirs = socket.socketpair()
    read_end, write_end = os.pipe()
    pid = 0
    try:
        try:
            pid = srv.fork(bundle, theirs, rlimits=(None, None), require=(), lifeline=read_end)
        finally:
            theirs.close()
            os.close(read_end)
        ours.recv(65536)  # Ready
        ours.sendall(encode(Call(id=1, name="spin", args=[], kwargs={})))
        zygote = srv.pid
        assert zygote is not None
        os.kill(zygote, signal.SIGKILL)
        time.sleep(0.2)
        assert not _gone(pid)  # the worker outlives its fork server, still spinning
        os.close(write_end)
        write_end = -1
        # Our end of the worker's socket stays open: only the lifeline ends it.
        assert _wait_gone([pid], timeout=10.0) == []
    finally:
        if write_end >= 0:
            os.close(write_end)
        ours.close()
        srv.shutdown()
        if pid:
            _kill_all([pid])


def test_a_worker_whose_host_died_before_it_armed_the_lifeline_exits_at_once() -> None:
    # The race: the host ends between the fork request and the worker arming its lifeline.
    read_end, write_end = os.pipe()
    os.close(write_end)
    pid = fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            arm_lifeline(read_end)
            os._exit(7)  # still running: the check failed
        finally:
            os._exit(8)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_an_armed_lifeline_kills_through_the_default_sigio_action() -> None:
    read_end, write_end = os.pipe()
    pid = fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(write_end)
            assert arm_lifeline(read_end)
            time.sleep(30)
            os._exit(7)
        finally:
            os._exit(8)
    os.close(read_end)
    time.sleep(0.1)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGIO


def _soft_cpu_limit(pid: int) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max cpu time"):
            return line.split()[3]
    raise AssertionError("no cpu line in /proc/<pid>/limits")


def _cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


@pytest.mark.parametrize(
    ("budgets", "backstop"),
    [
        ({}, DEFAULT_CPU_BACKSTOP_S),
        ({"wallClockMs": 2000}, 3),
        ({"cpuPercent": 50}, DEFAULT_CPU_BACKSTOP_S),
    ],
)
async def test_a_real_worker_has_a_finite_cpu_rlimit(
    tmp_path: Path, budgets: dict[str, int], backstop: int
) -> None:
    (tmp_path / "plugin.py").write_text(SPIN)
    manifest: dict[str, object] = {"name": "cpu", "permissions": {"budgets": budgets}}
    policy = PermissionPolicy.from_manifest(manifest, root=tmp_path)
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "plugin.py", policy=policy
    ) as sb:
        await sb.call("noop")  # re-armed at the call: soft = CPU used then + backstop
        soft = _soft_cpu_limit(sb.pid)
        assert soft != "unlimited"
        used = _cpu_seconds(sb.pid)
        assert backstop <= int(soft) <= used + backstop + 1


async def test_denials_keep_the_most_recent_and_count_them_all(tmp_path: Path) -> None:
    extra = 40
    (tmp_path / "plugin.py").write_text(
        "import suaveplan\n"
        "from suaveplan import SuaveplanError\n\n"
        "def deny(kind, n):\n"
        "    for i in range(n):\n"
        "        try:\n"
        "            if kind == 'secret':\n"
        "                suaveplan.secrets.get('s%d' % i)\n"
        "            else:\n"
        "                suaveplan.fetch('https://h%d.example/' % i)\n"
        "        except SuaveplanError:\n"
        "            pass\n"
    )
    policy = PermissionPolicy.from_manifest({"name": "den"}, root=tmp_path)
    async with await create_vm_sandbox(
        plugin_module_path=tmp_path / "plugin.py", policy=policy
    ) as sb:
        await sb.call("deny", "secret", extra)
        assert sb.denials_total == extra
        assert [d.reason.value for d in sb.denials] == ["secret-not-declared"] * extra
        await sb.call("deny", "fetch", MAX_RECORDED_DENIALS)
        kept = sb.denials
        assert sb.denials_total == extra + MAX_RECORDED_DENIALS
        assert len(kept) == MAX_RECORDED_DENIALS
        # The oldest (the secrets) were dropped; what is kept is the latest, oldest first.
        assert {d.reason.value for d in kept} == {"host-not-in-allowlist"}
        kept.clear()  # a copy: the sandbox's record is untouched
        assert len(sb.denials) == MAX_RECORDED_DENIALS
