"""Disk full during a write: the old file stays intact, no temp file is left, the host serves.

The fs adapter writes a temp file, fsyncs and renames it over the target, so running out of
space can only fail the temp file. Where the test may mount a small tmpfs (root, and mount
works) the disk is really full; otherwise the documented fallback injects ENOSPC into the
adapter's `os.write` for files beneath the test root. Either way the guest's call fails with
`SAND_FS_IO_ERROR`, and the target holds the last acknowledged contents. A second test uses
`RLIMIT_FSIZE` in a child process (no privileges needed): EFBIG, same guarantees.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from faults._support import HostProbe, SecurityRecord, policy
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm import create_vm_sandbox

DISK_BYTES = 1024 * 1024


def _mount_tmpfs(where: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    where.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},mode=0755", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    return result.returncode == 0


@pytest.fixture(params=["full-disk", "injected-enospc"])
def small_disk(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, str]]:
    """(root directory whose `data/` has about 1 MiB of room, "tmpfs" or "injected-enospc").

    `full-disk` mounts a tmpfs when the machine allows it and otherwise falls back to the
    injection, so the fallback is exercised everywhere and the real thing wherever possible.
    """
    disk = tmp_path / "disk"
    if request.param == "full-disk" and _mount_tmpfs(disk):
        try:
            yield disk, "tmpfs"
        finally:
            subprocess.run(["umount", "-l", str(disk)], check=False)
        return
    disk.mkdir(exist_ok=True)
    real_write = os.write
    used: dict[str, int] = {}

    def write(fd: int, data: bytes | memoryview) -> int:
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            where = ""
        if where.startswith(str(disk) + "/"):
            used[where] = used.get(where, 0) + len(data)  # temp file names are unique
            if used[where] > DISK_BYTES // 2:  # the old file already holds the rest
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    yield disk, "injected-enospc"


def _temp_files(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.endswith(".suaveplan-tmp")]


@pytest.mark.parametrize("seed", [771])
async def test_disk_full_during_a_guest_write_keeps_the_old_file_and_the_host_serving(
    seed: int,
    small_disk: tuple[Path, str],
    tmp_path: Path,
    security_record: SecurityRecord,
) -> None:
    rng = random.Random(seed)
    root, mechanism = small_disk
    probe = HostProbe(tmp_path)
    await probe.warm_up()
    (root / "data").mkdir()
    target = root / "data" / "doc.bin"
    acknowledged = rng.randbytes(DISK_BYTES // 3)
    target.write_bytes(acknowledged)
    shutil.copy(probe.plugin, root / "plugin.py")
    injected = survived = 0
    # The sandbox owns a BeneathRootFs on the small disk (no proxies given).
    async with await create_vm_sandbox(
        plugin_module_path=root / "plugin.py", policy=policy(root)
    ) as sb:
        for _ in range(6):
            too_big = rng.random() < 0.6
            size = (
                rng.randrange(DISK_BYTES, 2 * DISK_BYTES)
                if too_big
                else rng.randrange(1, DISK_BYTES // 4)
            )
            body = rng.randbytes(size)
            try:
                assert await sb.call("write", "/data/doc.bin", body) == size
            except SuaveplanError as exc:
                assert too_big, f"a write that fits failed ({mechanism}): {exc!r}"
                assert exc.code == "SAND_FS_IO_ERROR"
                injected += 1
                assert target.read_bytes() == acknowledged, "the old file was damaged"
                assert _temp_files(root / "data") == []
                survived += 1
            else:
                assert not too_big, f"a write larger than the disk succeeded ({mechanism})"
                acknowledged = body
            assert target.read_bytes() == acknowledged
            assert sb.state == "idle"
        assert injected > 0
        assert await sb.call("write", "/data/small.txt", b"still writable") == 14
    ok, why = await probe.healthy()
    assert ok, why
    security_record("faults", kind=f"disk-full-{mechanism}", injected=injected, survived=survived)


_FSIZE_CHILD = textwrap.dedent(
    """
    import json, resource, signal, sys
    from suaveplan_sandbox.adapters import BeneathRootFs
    from suaveplan_sandbox.errors import SuaveplanError
    root, limit, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    fs = BeneathRootFs(root)
    try:
        fs._write_sync("data/doc.bin", b"n" * size)
        out = {"ok": True}
    except SuaveplanError as exc:
        out = {"ok": False, "code": exc.code, "errno": getattr(exc.__cause__, "errno", None)}
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("seed", [772])
def test_file_size_limit_during_a_write_keeps_the_old_file(
    seed: int, tmp_path: Path, security_record: SecurityRecord
) -> None:
    rng = random.Random(seed)
    (tmp_path / "data").mkdir()
    target = tmp_path / "data" / "doc.bin"
    old = rng.randbytes(4096)
    target.write_bytes(old)
    rounds = 3
    survived = 0
    for _ in range(rounds):
        limit = rng.randrange(8192, 65536)
        size = rng.randrange(limit + 1, 4 * limit)
        child = subprocess.run(
            [sys.executable, "-c", _FSIZE_CHILD, str(tmp_path), str(limit), str(size)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        out = json.loads(child.stdout)
        assert out == {"ok": False, "code": "SAND_FS_IO_ERROR", "errno": errno.EFBIG}
        assert target.read_bytes() == old
        assert _temp_files(tmp_path / "data") == []
        survived += 1
    security_record("faults", kind="disk-full-rlimit-fsize", injected=rounds, survived=survived)
