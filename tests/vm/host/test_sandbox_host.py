"""Host-side behaviour of VmSandbox through real workers: budgets, crashes, isolation."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import InMemoryFs
from suaveplan_sandbox.vm import create_vm_sandbox, create_vm_sandbox_sync
from suaveplan_sandbox.vm._zygote import fork_server


def write_plugin(
    tmp: Path, source: str, *, budgets: dict[str, int] | None = None, fs: list[str] | None = None
) -> tuple[str, PermissionPolicy]:
    plugin = tmp / "plugin.py"
    plugin.write_text(source)
    perms: dict[str, object] = {"fs": fs or ["./data/*"]}
    if budgets:
        perms["budgets"] = budgets
    manifest: dict[str, object] = {"name": "hosttest", "version": "1.0.0", "permissions": perms}
    return str(plugin), PermissionPolicy.from_manifest(manifest, root=tmp)


ECHO = "def echo(x):\n    return x\n\ndef spin():\n    while True:\n        pass\n"


async def budget_code(tmp: Path, body: str, budgets: dict[str, int]) -> tuple[str, object]:
    path, policy = write_plugin(tmp, body, budgets=budgets)
    metrics = InMemoryMetrics()
    sb = await create_vm_sandbox(plugin_module_path=path, policy=policy, metrics=metrics)
    try:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("f")
        assert sb.state == "crashed"
        assert metrics.value("plugin.budget_exceeded_total") == 1
        return info.value.code, info.value.details.get("budget")
    finally:
        await sb.dispose()


def test_infinite_loop_ends_with_wall_clock_budget_exceeded(tmp_path: Path) -> None:
    code, budget = asyncio.run(
        budget_code(tmp_path, "def f():\n    while True:\n        pass\n", {"wallClockMs": 200})
    )
    assert (code, budget) == ("BUDGET_EXCEEDED", "wallClockMs")


def test_ten_gigabyte_allocation_ends_with_memory_budget_exceeded(tmp_path: Path) -> None:
    code, budget = asyncio.run(
        budget_code(
            tmp_path, "def f():\n    return len(b'x' * (10 * 1024 ** 3))\n", {"memoryMb": 64}
        )
    )
    assert (code, budget) == ("BUDGET_EXCEEDED", "memoryMb")


def test_huge_power_ends_with_a_budget_exceeded(tmp_path: Path) -> None:
    code, budget = asyncio.run(
        budget_code(
            tmp_path, "def f():\n    return 10 ** 10 ** 10\n", {"wallClockMs": 300, "memoryMb": 64}
        )
    )
    assert code == "BUDGET_EXCEEDED"
    assert budget in {"wallClockMs", "memoryMb", "cpuPercent"}


def test_sigkill_mid_call_is_a_coded_crash_and_the_next_sandbox_works(tmp_path: Path) -> None:
    async def main() -> None:
        path, policy = write_plugin(tmp_path, ECHO)
        metrics = InMemoryMetrics()
        sb = await create_vm_sandbox(plugin_module_path=path, policy=policy, metrics=metrics)
        call = asyncio.ensure_future(sb.call("spin"))
        await asyncio.sleep(0.05)
        os.kill(sb.pid, signal.SIGKILL)
        with pytest.raises(SuaveplanError) as info:
            await call
        assert info.value.code == "SAND_VM_WORKER_CRASHED"
        assert metrics.value("plugin.worker_crashed_total") == 1
        with pytest.raises(SuaveplanError) as again:
            await sb.call("echo", 1)
        assert again.value.code == "SAND_VM_WORKER_CRASHED"
        await sb.dispose()
        async with await create_vm_sandbox(plugin_module_path=path, policy=policy) as other:
            assert await other.call("echo", 5) == 5

    asyncio.run(main())


def test_worker_breaking_protocol_is_killed_and_the_host_carries_on(tmp_path: Path) -> None:
    async def main() -> None:
        path, policy = write_plugin(tmp_path, ECHO)
        sb = await create_vm_sandbox(plugin_module_path=path, policy=policy)
        good = await create_vm_sandbox(plugin_module_path=path, policy=policy)
        pid = sb.pid
        # Forge a frame as a compromised worker would: an oversized length prefix.
        sb._on_readable_data(b"\xff\xff\xff\xff")
        assert sb.state == "crashed"
        with pytest.raises(SuaveplanError) as info:
            await sb.call("echo", 1)
        assert info.value.code == "SAND_VM_WORKER_CRASHED"
        await asyncio.sleep(0.1)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        assert await good.call("echo", "still here") == "still here"
        await sb.dispose()
        await good.dispose()

    asyncio.run(main())


def test_calls_from_concurrent_tasks_get_their_own_answers() -> None:
    async def main(tmp: Path) -> None:
        path, policy = write_plugin(tmp, ECHO)
        boxes = [await create_vm_sandbox(plugin_module_path=path, policy=policy) for _ in range(8)]
        try:

            async def one(i: int) -> None:
                assert await boxes[i % 8].call("echo", [i, "x"]) == [i, "x"]

            await asyncio.gather(*(one(i) for i in range(1000)))
        finally:
            for b in boxes:
                await b.dispose()

    import tempfile

    asyncio.run(main(Path(tempfile.mkdtemp())))


def test_killed_fork_server_is_detected_and_restarted(tmp_path: Path) -> None:
    async def main() -> None:
        path, policy = write_plugin(tmp_path, ECHO)
        async with await create_vm_sandbox(plugin_module_path=path, policy=policy) as sb:
            assert await sb.call("echo", 1) == 1
        server = fork_server()
        old = server.pid
        assert old is not None
        starts = server.starts
        os.kill(old, signal.SIGKILL)
        await asyncio.sleep(0.05)
        async with await create_vm_sandbox(plugin_module_path=path, policy=policy) as sb:
            assert await sb.call("echo", 2) == 2
        assert server.starts == starts + 1
        assert server.pid != old

    asyncio.run(main())


def test_blocking_facade_calls_and_disposes(tmp_path: Path) -> None:
    path, policy = write_plugin(tmp_path, ECHO)
    with create_vm_sandbox_sync(plugin_module_path=path, policy=policy) as sb:
        assert sb.call("echo", {"a": 1}) == {"a": 1}
        assert "seccomp" in sb.hardening.active
    with pytest.raises(SuaveplanError) as info:
        sb.call("echo", 1)
    assert info.value.code == "SAND_VM_DISPOSED"


def test_process_layer_holds_inside_a_real_worker(tmp_path: Path) -> None:
    async def main() -> dict[str, object]:
        path, policy = write_plugin(tmp_path, ECHO)
        sb = await create_vm_sandbox(
            plugin_module_path=path, policy=policy, _test_process_probe=True
        )
        try:
            probe = await sb._process_probe()
            assert isinstance(probe, dict)
            return probe
        finally:
            await sb.dispose()

    os.environ["SUAVEPLAN_TEST_SECRET"] = "hunter2"
    try:
        probe = asyncio.run(main())
    finally:
        del os.environ["SUAVEPLAN_TEST_SECRET"]
    assert str(probe["open_etc_passwd"]).startswith("denied")
    assert str(probe["socket_inet"]).startswith("denied")
    assert str(probe["fork"]).startswith("denied")
    assert str(probe["exec"]).startswith("denied")
    assert probe["env"] == {}
    # The fork server loads the worker side only: none of the host's stack is inherited.
    modules = {str(name).partition(".")[0] for name in probe["modules"]}  # type: ignore[attr-defined]
    assert "suaveplan_sandbox" in modules
    host_stack = {
        "asyncio", "pydantic", "pydantic_core", "sqlglot", "httpx", "httpcore", "anyio",
        "psutil", "prometheus_client", "ada_url", "wasmtime", "sqlite3", "ssl", "click",
        "rich", "pygments",
    }  # fmt: skip
    assert modules.isdisjoint(host_stack), sorted(modules & host_stack)
    assert not any(m.startswith("suaveplan_sandbox.vm._sandbox") for m in probe["modules"])  # type: ignore[attr-defined]


def test_probe_is_off_by_default(tmp_path: Path) -> None:
    async def main() -> str:
        path, policy = write_plugin(tmp_path, ECHO)
        async with await create_vm_sandbox(plugin_module_path=path, policy=policy) as sb:
            with pytest.raises(SuaveplanError) as info:
                await sb._process_probe()
            return info.value.code

    assert asyncio.run(main()) == "SAND_VM_NO_SUCH_FUNCTION"


def test_host_call_outside_the_allowlist_is_denied_and_recorded(tmp_path: Path) -> None:
    async def main() -> None:
        path, policy = write_plugin(
            tmp_path, "import suaveplan\n\ndef f():\n    return suaveplan.fs.read_bytes('/etc/x')\n"
        )
        fs = InMemoryFs()
        async with await create_vm_sandbox(
            plugin_module_path=path, policy=policy, proxies=Adapters(fs=fs)
        ) as sb:
            with pytest.raises(SuaveplanError) as info:
                await sb.call("f")
            assert info.value.code == "SAND_PERM_DENIED"
            assert fs.calls == []
            assert len(sb.denials) == 1

    asyncio.run(main())


def _counts() -> tuple[int, int, int]:
    server = fork_server()
    kids = len(psutil.Process(server.pid).children()) if server.pid else 0
    return len(os.listdir("/proc/self/fd")), kids, threading.active_count()


def _grown(now: tuple[int, int, int], before: tuple[int, int, int]) -> bool:
    """A leak is growth: a count may also fall, when an earlier test's object is collected."""
    return any(n > b for n, b in zip(now, before, strict=True))


@pytest.mark.slow
def test_500_create_dispose_cycles_leak_no_fds_processes_or_threads(tmp_path: Path) -> None:
    async def main() -> None:
        # A create reads the plugin in the loop's default executor, which starts another
        # thread whenever a job arrives before the last one's thread went idle: one thread,
        # so the count measures the sandboxes, not the pool's growth under a busy machine.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        path, policy = write_plugin(tmp_path, ECHO)
        async with await create_vm_sandbox(plugin_module_path=path, policy=policy):
            pass
        await asyncio.sleep(0.2)
        fork_server().ping()
        gc.collect()
        before = _counts()
        for _ in range(500):
            sb = await create_vm_sandbox(plugin_module_path=path, policy=policy)
            await sb.dispose()
        for _ in range(50):
            await asyncio.sleep(0.05)
            fork_server().ping()
            if not _grown(_counts(), before):
                break
        assert not _grown(_counts(), before), (_counts(), before)

    asyncio.run(main())
