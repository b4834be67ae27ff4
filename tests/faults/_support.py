"""Shared pieces of the fault-injection tests: a plugin, a policy, and the host's health check.

Every fault test ends the same way: after the fault, the host must still serve (a brand-new
VM sandbox and a brand-new WASM sandbox answer a call) and must hold no more resources than
before the fault (fds, live child processes, threads). `HostProbe` takes the baseline after a
warm-up and `HostProbe.healthy()` is the post-condition; it waits a bounded time for
asynchronous clean-up (the fork server reaps workers on SIGCHLD, executor threads unwind).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import psutil
import wasmtime

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._zygote import fork_server
from suaveplan_sandbox.wasm import create_wasm_sandbox

PLUGIN: Final = """\
import suaveplan


def echo(x):
    return x


def spin(n):
    total = 0
    for i in range(n):
        total += i
    return total


def write(path, data):
    suaveplan.fs.write_bytes(path, data)
    return len(data)


def read(path):
    return suaveplan.fs.read_bytes(path)


def secret(name):
    return suaveplan.secrets.get(name)


def query(sql):
    return suaveplan.db.query(sql)


def hog(mb):
    blocks = []
    for _ in range(mb):
        blocks.append(b"x" * (1024 * 1024))
    return len(blocks)
"""

# A WASM guest that adds, asks the host for a secret through the `suaveplan` imports, and
# grows its memory (one page, or `pages` at a time) until refused, then traps (as a C guest's failed malloc would abort).
GUEST_WAT: Final = """
(module
  (import "suaveplan" "secrets_get" (func $sg (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "API_KEY")
  (data (i32.const 16) "OTHER_KEY")
  (func (export "add") (param i32 i32) (result i32)
    (i32.add (local.get 0) (local.get 1)))
  (func (export "secret") (result i32)
    (call $sg (i32.const 0) (i32.const 7) (i32.const 256) (i32.const 64) (i32.const 512)))
  (func (export "secret_denied") (result i32)
    (call $sg (i32.const 16) (i32.const 9) (i32.const 256) (i32.const 64) (i32.const 512)))
  (func (export "grow") (result i32)
    (loop $again
      (br_if $again (i32.ne (memory.grow (i32.const 1)) (i32.const -1))))
    unreachable)
  (func (export "grow_by") (param $pages i32) (result i32)
    (loop $again
      (br_if $again (i32.ne (memory.grow (local.get $pages)) (i32.const -1))))
    unreachable))
"""

# The suite's `security_record` fixture (tests/conftest.py): one evidence row per fault kind.
SecurityRecord = Callable[..., None]

# Threads the default asyncio executor keeps for `to_thread` (bounded by the pool size, and
# reused): they are not a leak, so the thread census leaves them out.
_POOL_PREFIX: Final = "asyncio_"


@dataclass(frozen=True, slots=True)
class Resources:
    fds: int
    processes: int
    threads: int

    def within(self, baseline: Resources) -> bool:
        return (
            self.fds <= baseline.fds
            and self.processes <= baseline.processes
            and self.threads <= baseline.threads
        )


def resources() -> Resources:
    """Open fds, live (non-zombie) descendants, and threads other than the default pool.

    Collects garbage first: a disposed WASM store caught in a reference cycle (an adapter
    exception's traceback holds the guest thread's frame) keeps its preopen fds until the
    cyclic collector runs. That is late release, not a leak; a leak survives a collection.
    """
    gc.collect()
    fork_server().ping()  # collects the fork server's exit notices
    live = 0
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                live += 1
        except psutil.NoSuchProcess:
            continue
    threads = sum(1 for t in threading.enumerate() if not t.name.startswith(_POOL_PREFIX))
    return Resources(fds=len(os.listdir("/proc/self/fd")), processes=live, threads=threads)


def write_plugin(tmp: Path) -> Path:
    path = tmp / "faulty_plugin.py"
    path.write_text(PLUGIN)
    return path


def policy(root: Path, **budgets: int) -> PermissionPolicy:
    permissions: dict[str, object] = {"fs": ["rw:./data/*"]}
    if budgets:
        permissions["budgets"] = budgets
    return PermissionPolicy.from_manifest(
        {
            "name": "faults",
            "version": "1.0.0",
            "permissions": permissions,
            "secrets": [{"name": "API_KEY"}],
            "database": {"tablePrefix": "faults_"},
        },
        root=root,
    )


def write_wat(tmp: Path, text: str = GUEST_WAT) -> Path:
    path = tmp / "faulty_guest.wasm"
    path.write_bytes(wasmtime.wat2wasm(text))
    return path


def kill(pid: int) -> None:
    """SIGKILL `pid` if it still exists."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _pid_gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


async def pid_gone(pid: int, timeout_s: float = 5.0) -> bool:
    """The process has exited (reaped, or a zombie awaiting its parent) within the timeout."""
    deadline = time.monotonic() + timeout_s
    while not _pid_gone(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


class HostProbe:
    """Baseline resources after a warm-up; `healthy()` is every fault test's post-condition."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        (tmp / "data").mkdir(exist_ok=True)
        self.plugin = write_plugin(tmp)
        self.wasm = write_wat(tmp)
        self.baseline = Resources(0, 0, 0)

    async def serves(self) -> bool:
        """A brand-new VM sandbox and a brand-new WASM sandbox each answer a fresh call."""
        async with await create_vm_sandbox(
            plugin_module_path=self.plugin, policy=policy(self.tmp)
        ) as vm:
            if await vm.call("echo", "alive") != "alive":
                return False
        async with await create_wasm_sandbox(
            wasm_module_path=self.wasm, policy=policy(self.tmp), proxies=Adapters()
        ) as wasm:
            return bool(await wasm.call("add", 2, 3) == 5)

    async def warm_up(self, workload: Callable[[], Awaitable[object]] | None = None) -> None:
        # Start the fork server, the wasmtime engine and the default executor once (and run
        # the test's own `workload` once: wasmtime keeps a memory image per module and its
        # WASI runtime's epoll fds for the process), so the baseline already holds
        # everything that lives for the whole process.
        assert await self.serves()
        if workload is not None:
            await workload()
        await asyncio.to_thread(lambda: None)
        await self._settle(None)
        self.baseline = resources()

    async def _settle(self, baseline: Resources | None, timeout_s: float = 5.0) -> Resources:
        deadline = time.monotonic() + timeout_s
        while True:
            now = resources()
            if baseline is None or now.within(baseline) or time.monotonic() > deadline:
                return now
            await asyncio.sleep(0.05)

    async def healthy(self) -> tuple[bool, str]:
        """(all post-conditions hold, why not). Serves first, then checks nothing leaked."""
        try:
            serving = await self.serves()
        except Exception as exc:
            return False, f"host no longer serves: {exc!r}"
        if not serving:
            return False, "a fresh call returned a wrong answer"
        now = await self._settle(self.baseline)
        if not now.within(self.baseline):
            return False, f"leaked resources: {now} > baseline {self.baseline}"
        return True, ""
