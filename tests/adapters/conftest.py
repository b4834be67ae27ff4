"""Session-scoped real servers for the adapter tests (started on temp sockets, shut down)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


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
        for _ in range(500):
            if sock.exists():
                break
            if proc.poll() is not None:
                pytest.fail("redis-server exited at startup")
            time.sleep(0.01)
        else:
            pytest.fail("redis-server did not create its socket")
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
