"""A hardened worker holds exactly its IPC socket and its lifeline: fds 0, 1 and 2 are closed
like every other inherited fd (docs/security.md, layer `fds`), and one worker's per-request
settings never reach another's.

Counted from outside, through /proc/<pid>: inside the worker Landlock refuses to list
/proc/self/fd (the process probe reports `denied`).
"""

from __future__ import annotations

import asyncio
import os
import pickle
from pathlib import Path

from _forking import fork
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox
from suaveplan_sandbox.vm._hardening import RlimitSettings, apply_hardening, prepare_hardening
from suaveplan_sandbox.vm._sandbox import INTERPRETER_SLACK_BYTES

PLUGIN = "def f():\n    return 1\n"


def _fds(pid: int) -> dict[int, str]:
    base = f"/proc/{pid}/fd"
    return {int(n): os.readlink(f"{base}/{n}") for n in os.listdir(base)}


async def _sandbox(tmp_path: Path, budgets: dict[str, int] | None = None) -> VmSandbox:
    (tmp_path / "plugin.py").write_text(PLUGIN)
    manifest: dict[str, object] = {"name": "fds", "permissions": {"budgets": budgets or {}}}
    policy = PermissionPolicy.from_manifest(manifest, root=tmp_path)
    return await create_vm_sandbox(plugin_module_path=tmp_path / "plugin.py", policy=policy)


def test_a_real_worker_holds_only_its_socket_and_its_lifeline(tmp_path: Path) -> None:
    async def main() -> tuple[dict[int, str], int]:
        async with await _sandbox(tmp_path) as sb:
            assert await sb.call("f") == 1
            assert "fds" in sb.hardening.active
            return _fds(sb.pid), os.fstat(sb._lifeline).st_ino

    fds, lifeline_inode = asyncio.run(main())
    assert not {0, 1, 2} & set(fds), fds
    kinds = sorted(link.split(":")[0] for link in fds.values())
    assert kinds == ["pipe", "socket"], fds
    # The pipe is the lifeline whose write end the host holds, not one the zygote had.
    assert f"pipe:[{lifeline_inode}]" in fds.values()


def _open_fds_below(limit: int) -> list[int]:
    out = []
    for fd in range(limit):
        try:
            os.fstat(fd)
        except OSError:
            continue
        out.append(fd)
    return out


def _hardened_child_fds(keep_extra: list[int]) -> dict[str, list[int]]:
    """Fork; in the child put /dev/null on fds 0-2 and 7-12, harden keeping `keep_extra` and
    the report pipe, and report which fds below 64 are open after."""
    plan = prepare_hardening(RlimitSettings(address_space_bytes=None, cpu_seconds=30))
    r, w = os.pipe()
    pid = fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(r)
            w2 = os.dup2(w, 40)
            os.close(w)
            null = os.open(os.devnull, os.O_RDONLY)
            for fd in (0, 1, 2, 7, 8, 9, 10, 11, 12):
                if fd != null:
                    os.dup2(null, fd)
            if null not in (0, 1, 2, 7, 8, 9, 10, 11, 12):
                os.close(null)
            before = _open_fds_below(64)
            apply_hardening(plan, keep_fds=[*keep_extra, w2])
            after = _open_fds_below(64)
            os.write(w2, pickle.dumps({"before": before, "after": after}))
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    result = pickle.loads(data)
    assert isinstance(result, dict)
    return result


def test_hardening_keeps_fd_0_and_neighbouring_fds_when_asked_and_closes_the_rest() -> None:
    # fd 0 kept is the gap of length zero that once became close_range(0, UINT_MAX).
    out = _hardened_child_fds([0, 8, 9, 11])
    assert {0, 1, 2, 7, 8, 9, 10, 11, 12, 40} <= set(out["before"])
    assert out["after"] == [0, 8, 9, 11, 40]


def test_hardening_closes_fds_0_1_2_unless_kept() -> None:
    out = _hardened_child_fds([])
    assert out["after"] == [40]


def _limit(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith(name):
            return line[len(name) :].split()[0]
    raise AssertionError(f"no {name!r} in /proc/{pid}/limits")


def test_each_worker_gets_its_own_rlimits_however_requests_interleave(tmp_path: Path) -> None:
    # Settings are built per request in the fork server before its fork: a worker without a
    # memory budget must not inherit the address-space cap of the one forked before it, nor
    # one with a budget the cap of another.
    mib = 1024 * 1024
    cases: list[tuple[dict[str, int], str, str]] = [
        ({"memoryMb": 64, "wallClockMs": 2000}, str(64 * mib + INTERPRETER_SLACK_BYTES), "3"),
        ({}, "unlimited", "300"),
        ({"memoryMb": 128}, str(128 * mib + INTERPRETER_SLACK_BYTES), "300"),
        ({"wallClockMs": 5000}, "unlimited", "6"),
    ]

    async def main() -> list[tuple[str, str, str]]:
        out = []
        sandboxes = []
        try:
            for i, (budgets, _, _) in enumerate(cases * 2):
                d = tmp_path / str(i)
                d.mkdir()
                sb = await _sandbox(d, budgets)
                sandboxes.append(sb)
                assert await sb.call("f") == 1
                out.append(
                    (
                        _limit(sb.pid, "Max address space"),
                        _limit(sb.pid, "Max cpu time"),
                        _limit(sb.pid, "Max open files"),
                    )
                )
        finally:
            for sb in sandboxes:
                await sb.dispose()
        return out

    seen = asyncio.run(main())
    for (_, address_space, cpu_backstop), (got_as, got_cpu, got_nofile) in zip(
        cases * 2, seen, strict=True
    ):
        assert got_as == address_space
        # The soft CPU limit is re-armed at each call: CPU used so far + the backstop.
        assert int(cpu_backstop) <= int(got_cpu) <= int(cpu_backstop) + 2
        assert got_nofile == "64"
