"""Session-scoped real servers for the adapter tests (started on temp sockets, shut down)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "redis-server is not installed; .ci/run installs it (apt-get install redis-server)"
        )
    tmp = Path(tempfile.mkdtemp(prefix="suaveplan-redis-"))
    sock = tmp / "redis.sock"
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp),
        ],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(500):
        if sock.exists():
            break
        if proc.poll() is not None:
            pytest.fail("redis-server exited at startup")
        time.sleep(0.01)
    else:
        proc.kill()
        pytest.fail("redis-server did not create its socket")
    yield f"unix://{sock}"
    proc.terminate()
    proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)
