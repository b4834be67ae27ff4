"""Session-scoped real servers for the adapter tests (started on temp sockets, shut down)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _accepts(path: Path) -> bool:
    """The server answers a `QUIT` and has closed (so freed) that connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(5)
        try:
            probe.connect(str(path))
            probe.sendall(b"QUIT\r\n")
            while probe.recv(64):
                pass  # until the server's close: a probe still open would count as a client
        except OSError:
            return False
    return True


@contextlib.contextmanager
def running_redis() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A throw-away redis-server on a unix socket (no TCP port): its URL and process."""
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
    try:
        # Ready once a connection is served: the socket file appears at bind(), before
        # listen(), and a client connecting in between is refused.
        deadline = time.monotonic() + 10
        while not _accepts(sock):
            if proc.poll() is not None:
                pytest.fail("redis-server exited at startup")
            if time.monotonic() > deadline:
                pytest.fail("redis-server did not accept connections on its socket")
            time.sleep(0.01)
        yield f"unix://{sock}", proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with running_redis() as (url, _proc):
        yield url


@pytest.fixture
def own_redis() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server for one test, which the test may stop."""
    with running_redis() as server:
        yield server


PG_BIN = Path("/usr/lib/postgresql/15/bin")


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[str]:
    if not (PG_BIN / "initdb").exists():
        pytest.fail(
            "PostgreSQL 15 is not installed; .ci/run installs it (apt-get install postgresql)"
        )
    tmp = Path(tempfile.mkdtemp(prefix="suaveplan-pg-"))
    shutil.chown(tmp, "postgres")
    data, sock = tmp / "data", tmp
    run = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*run, str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "admin"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        [
            *run,
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(data),
            "-w",
            "-l",
            str(tmp / "log"),
            "-o",
            f"-k {sock} -c listen_addresses='' -p 54329",
            "start",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    yield f"host={sock} port=54329 user=admin dbname=postgres"
    subprocess.run(
        [*run, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
        check=False,
        stdout=subprocess.DEVNULL,
    )
    shutil.rmtree(tmp, ignore_errors=True)
