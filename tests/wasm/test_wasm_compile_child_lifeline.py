"""The compile child dies with its host, however the host ends, busy compiling or idle.

The host here is a subprocess of the test (the host's own interpreter, importing the package)
that loads a module on a worker thread, as `create_wasm_sandbox` does (`asyncio.to_thread`),
says which compile child has it, and is then SIGKILLed: no `atexit`, no `finally`, nothing of
the host runs. The busy case's module is within every default bound and takes tens of
seconds of one core to compile (about 0.3 s per function here, 120 functions), far longer
than the deadline the test polls with; so a child that outlives its host only until its
compile is done fails the test. The deadline is a liveness guard, not a measure of speed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Final

import pytest
import wasmtime

from wasm._module_bytes import leb, section

# A function of one i32 local: local.get 0, then (i32.const 1, i32.add) repeated, local.set 0.
# Cranelift folds the chain to a constant: ~0.3 s of one core and ~0.1 GB per 200 KB body, a
# 14 KB artefact. 120 of them (24 MB) are within every header bound (256 KiB per body, 64 MiB
# of code, 1 local) and cost the child tens of seconds of CPU time.
_ADDS_PER_BODY: Final = 200_000 // 3
_SLOW_FUNCTIONS: Final = 120
# How long the test waits for the child to go: generous (the kernel signals it at once), and
# far shorter than its compile.
_GONE_WITHIN_S: Final = 15.0

_HOST: Final = r"""
import asyncio, sys, traceback
from suaveplan_sandbox.wasm import _engine
from suaveplan_sandbox.wasm._compile_child import compile_server

async def main(path: str, state: str) -> None:
    pool = compile_server()
    with open(path, "rb") as fh:
        wasm = fh.read()
    task = asyncio.create_task(asyncio.to_thread(_engine.load_module, wasm))
    if state == "busy":
        while pool.busy_pid is None and not task.done():
            await asyncio.sleep(0.005)
        pid = pool.busy_pid
    else:
        try:
            await task
        except BaseException:
            traceback.print_exc()
        pid = pool.pid
    print(pid, flush=True)
    await asyncio.Event().wait()  # until SIGKILLed

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _slow_to_compile() -> bytes:
    body = b"\x01\x01\x7f" + b"\x20\x00" + b"\x41\x01\x6a" * _ADDS_PER_BODY + b"\x21\x00\x0b"
    bodies = [body] * _SLOW_FUNCTIONS
    types = section(1, leb(1) + b"\x60\x00\x00")
    funcs = section(3, leb(len(bodies)) + b"\x00" * len(bodies))
    code = section(10, leb(len(bodies)) + b"".join(leb(len(b)) + b for b in bodies))
    name = uuid.uuid4().hex.encode()  # bytes no cache has seen
    return b"\0asm\x01\0\0\0" + types + funcs + code + section(0, leb(len(name)) + name)


def _small() -> bytes:
    wat = f'(module (func (export "answer") (result i32) (i32.const {uuid.uuid4().int % 1000})))'
    return bytes(wasmtime.wat2wasm(wat))


def _dead(pid: int) -> bool:
    """Gone, or a zombie (dead, waiting for whoever adopted it to reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"Z", b"X")


@pytest.mark.skipif(sys.platform != "linux", reason="the lifeline is a Linux mechanism")
@pytest.mark.parametrize("state", ["busy", "idle"])
def test_the_compile_child_dies_soon_after_its_host_is_sigkilled(
    tmp_path: Path, state: str
) -> None:
    path = tmp_path / "module.wasm"
    path.write_bytes(_slow_to_compile() if state == "busy" else _small())
    host = subprocess.Popen(
        [sys.executable, "-c", _HOST, str(path), state],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    child: int | None = None
    try:
        assert host.stdout is not None
        line = host.stdout.readline().strip()
        if not line.isdigit():
            host.kill()
            _, err = host.communicate()
            pytest.fail(f"the host named no compile child: {line!r} {err[-2000:]!r}")
        child = int(line)
        assert not _dead(child)
        host.kill()
        host.wait()
        deadline = time.monotonic() + _GONE_WITHIN_S
        while not _dead(child) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _dead(child), f"the compile child outlived its host ({state})"
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
        if child is not None and not _dead(child):
            os.kill(child, signal.SIGKILL)  # the child we made, never anyone else's
        for stream in (host.stdout, host.stderr):
            if stream is not None:
                stream.close()
