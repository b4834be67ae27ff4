"""BeneathRootFs, red-team pass 2: what a plugin (racing itself, or sharing a writable subtree
with a WASM guest or another plugin) can do with path strings, file contents and timing.

Probed, beyond the first pass (test_fs_attacks, test_fs, test_fs_inline, test_fs_quota,
test_beneath): quota races between a shrinking write and a growing one; kernel filesystems
(procfs, sysfs) mounted or bind-mounted beneath the root; sparse 1 TB files and files that
grow while read; un-normalised paths (`a/.`, `a//b`, `a/./b`, trailing `/`, `..`) handed to
the adapter directly, inline and on the thread; names with newlines, invalid UTF-8 and
Unicode normalisation variants (NFC and NFD); a write whose target becomes a directory before
its rename (temp file and quota afterwards); the mode of files written over setuid files; and
whether any coded error names the host's root or a temp file.

Found and fixed (the tests fail on the code before the fix):

- Quota evasion. A write that shrank a file credited the room it would free when it
  *reserved*, before its rename. A concurrent write could spend that room; if the shrinking
  write was then cancelled (a plugin can crash its own sandbox, which cancels its in-flight
  calls) its release put the credit back, and the files beneath the root stayed past the
  quota, by the shrunk file's size each round. Now only growth is reserved up front; what a
  write frees is credited after its rename.
- Kernel filesystems. With procfs mounted beneath the root (a container rootfs as the root,
  say), `proc/<pid>/environ` was read like any file: the host's environment, credentials
  included; sysfs files likewise, `list_dir("proc")` listed the host's processes, and a
  file bind-mounted from procfs into a writable directory was read too. Nothing on a kernel
  filesystem (`KERNEL_FILESYSTEMS`) is now opened or listed (`SAND_FS_NOT_A_FILE`,
  `details.reason` `kernel-filesystem`), and the quota's measuring walk skips such mounts.

Contained, pinned here: everything else above.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import unicodedata
from pathlib import Path

import pytest

from adapters.test_fs_quota import _fs as _open
from adapters.test_fs_quota import opened as opened_fixture
from adapters.test_fs_quota import root as root_fixture
from suaveplan_sandbox.adapters._fs import BeneathRootFs, _WriteTicket
from suaveplan_sandbox.adapters._fs_quota import charge
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions._fs_rules import FsRuleSet

BLOCK = 4096
MODES = [pytest.param(None, id="openat2"), pytest.param(False, id="per-component")]


# The quota tests' root (with an empty `data/`), and their adapters closed after each test.
root, opened = root_fixture, opened_fixture


async def _error(coro: object) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        await coro  # type: ignore[misc]
    return info.value


def _on_disk(folder: Path) -> int:
    return sum(charge(p.stat().st_size) for p in folder.rglob("*") if p.is_file())


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*.suaveplan-tmp")]


class _PauseBeforeRename:
    """Holds the write running on the thread named `name` at its temp file's `fsync` (after
    its reservation, before its rename) until `go` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.name = name
        self.paused = threading.Event()
        self.go = threading.Event()
        real = os.fsync

        def fsync(fd: int) -> None:
            if threading.current_thread().name == self.name and not self.paused.is_set():
                self.paused.set()
                self.go.wait(30)
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)


# -- quota races ---------------------------------------------------------------------------


def test_a_cancelled_shrinking_write_lends_no_room_to_a_racing_write(
    root: Path, opened: list[BeneathRootFs], monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "data" / "big").write_bytes(b"b" * (8 * BLOCK))
    fs = _open(opened, root, max_root_bytes=9 * BLOCK)
    pause = _PauseBeforeRename(monkeypatch, "shrinker")
    ticket = _WriteTicket()
    codes: list[str] = []

    def shrink() -> None:
        try:
            fs._write_sync("data/big", b"s", ticket)
        except SuaveplanError as exc:
            codes.append(exc.code)

    shrinker = threading.Thread(target=shrink, name="shrinker")
    shrinker.start()
    assert pause.paused.wait(30)
    # The shrink has not happened: its 7 blocks are not free yet.
    with pytest.raises(SuaveplanError) as info:
        fs._write_sync("data/new", b"n" * (7 * BLOCK))
    assert info.value.details["reason"] == "quota-exceeded"
    ticket.cancel()  # the plugin crashed its own sandbox: the shrink never lands
    pause.go.set()
    shrinker.join(30)
    assert codes == ["SAND_CANCELLED"]
    assert _on_disk(root) <= 9 * BLOCK
    assert fs._usage.used == _on_disk(root)
    assert _leftovers(root) == []


def test_a_shrink_frees_its_room_once_renamed_and_racing_writes_settle_exactly(
    root: Path, opened: list[BeneathRootFs], monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "data" / "big").write_bytes(b"b" * (4 * BLOCK))
    fs = _open(opened, root, max_root_bytes=6 * BLOCK)
    fs._write_sync("data/x", b"x")  # measured: five blocks
    pause = _PauseBeforeRename(monkeypatch, "shrinker")
    shrinker = threading.Thread(target=fs._write_sync, args=("data/big", b"s"), name="shrinker")
    shrinker.start()
    assert pause.paused.wait(30)
    fs._write_sync("data/big", b"g" * (5 * BLOCK))  # grows big by one block: fits exactly
    pause.go.set()
    shrinker.join(30)
    assert (root / "data" / "big").read_bytes() == b"s"  # the shrink renamed last
    assert fs._usage.used == _on_disk(root) == 2 * BLOCK
    fs._write_sync("data/y", b"y" * (4 * BLOCK))  # the freed room is spendable now
    assert fs._usage.used == _on_disk(root) == 6 * BLOCK


# -- kernel filesystems beneath the root -------------------------------------------------------

_KERNEL_MOUNTS = """
import asyncio, json, os, subprocess, sys
from suaveplan_sandbox.adapters._fs import BeneathRootFs
from suaveplan_sandbox.errors import SuaveplanError

root = sys.argv[1]
os.environ["SUAVEPLAN_PROBE_SECRET"] = "hunter2"
subprocess.run(["mount", "-t", "proc", "proc", root + "/proc"], check=True)
subprocess.run(["mount", "-t", "sysfs", "sysfs", root + "/sys"], check=True)
pid = os.getpid()
subprocess.run(["mount", "--bind", f"/proc/{pid}/environ", root + "/data/env"], check=True)

async def answer(coro):
    try:
        value = await coro
    except SuaveplanError as exc:
        return [exc.code, exc.details.get("reason")]
    return repr(value)[:200]

async def main():
    out = {}
    for mode in (None, False):
        for inline in (True, False):
            fs = BeneathRootFs(root, use_openat2=mode, inline_io=inline, max_root_bytes=1 << 20)
            key = f"{mode}-{inline}"
            out[key] = {
                "environ": await answer(fs.read_bytes(f"proc/{pid}/environ", max_bytes=1 << 20)),
                "status": await answer(fs.read_bytes(f"proc/{pid}/status", max_bytes=1 << 20)),
                "sysctl": await answer(fs.read_bytes("proc/sys/kernel/hostname", max_bytes=99)),
                "sysfs": await answer(fs.read_bytes("sys/kernel/uevent_seqnum", max_bytes=99)),
                "bound": await answer(fs.read_bytes("data/env", max_bytes=1 << 20)),
                "list": await answer(fs.list_dir("proc")),
                "exists": await answer(fs.exists(f"proc/{pid}/environ")),
                "write": await answer(fs.write_bytes("data/ok", b"fine")),
                "read_own": await answer(fs.read_bytes("data/ok", max_bytes=99)),
            }
            fs.close()
    print(json.dumps(out))

asyncio.run(main())
"""


def test_nothing_on_a_kernel_filesystem_beneath_the_root_is_read_or_listed(
    root: Path,
) -> None:
    for name in ("proc", "sys"):
        (root / name).mkdir()
    (root / "data" / "env").write_bytes(b"")  # the bind mount's mount point
    unshare = shutil.which("unshare")
    if unshare is None or (
        subprocess.run([unshare, "-m", "true"], capture_output=True, check=False).returncode != 0
    ):
        # No private mount namespace here (it needs root and util-linux `unshare`): the
        # host's own procfs and sysfs, beneath a root of "/", are checked instead.
        asyncio.run(_the_hosts_kernel_filesystems_are_refused_beneath_slash())
        return
    done = subprocess.run(
        [unshare, "-m", sys.executable, "-c", _KERNEL_MOUNTS, str(root)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "hunter2" not in done.stdout
    refused = ["SAND_FS_NOT_A_FILE", "kernel-filesystem"]
    for key, seen in json.loads(done.stdout).items():
        for what in ("environ", "status", "sysctl", "sysfs", "bound", "list", "exists"):
            assert seen[what] == refused, (key, what, seen[what])
        # The root's own files are untouched, and the quota's walk measured the tree (kcore,
        # 128 TiB by its size, would otherwise hold every write past any quota).
        assert seen["write"] == "None", key
        assert seen["read_own"] == repr(b"fine"), key


async def _the_hosts_kernel_filesystems_are_refused_beneath_slash() -> None:
    refused = ("SAND_FS_NOT_A_FILE", "kernel-filesystem")
    pid = os.getpid()
    for mode in (None, False):
        for inline in (True, False):
            fs = BeneathRootFs(Path("/"), use_openat2=mode, inline_io=inline)
            try:
                for request in (
                    fs.read_bytes(f"proc/{pid}/environ", max_bytes=1 << 20),
                    fs.read_bytes(f"proc/{pid}/status", max_bytes=1 << 20),
                    fs.read_bytes("proc/sys/kernel/hostname", max_bytes=99),
                    fs.read_bytes("sys/kernel/uevent_seqnum", max_bytes=99),
                    fs.list_dir("proc"),
                    fs.list_dir("sys/kernel"),
                ):
                    exc = await _error(request)
                    assert (exc.code, exc.details.get("reason")) == refused, (mode, inline)
            finally:
                fs.close()


async def test_the_hosts_own_proc_and_sys_are_refused_beneath_a_root_of_slash() -> None:
    # Needs no mount: a root of "/" holds the host's procfs and sysfs. Before, a plugin with
    # such a root read `proc/<pid>/environ`, the host's environment.
    await _the_hosts_kernel_filesystems_are_refused_beneath_slash()


# -- sizes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("use_openat2", MODES)
@pytest.mark.parametrize("inline_io", [True, False], ids=["inline", "thread"])
async def test_a_sparse_terabyte_file_is_refused_without_being_read(
    root: Path, opened: list[BeneathRootFs], use_openat2: bool | None, inline_io: bool
) -> None:
    with open(root / "data" / "sparse", "wb") as handle:
        handle.truncate(1 << 40)
    fs = _open(opened, root, use_openat2=use_openat2, inline_io=inline_io)
    exc = await _error(fs.read_bytes("data/sparse", max_bytes=1 << 40))
    assert exc.code == "SAND_FS_TOO_LARGE"


async def test_a_file_growing_while_read_is_refused_past_the_limit(
    root: Path, opened: list[BeneathRootFs], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = root / "data" / "grows"
    target.write_bytes(b"g" * 100)
    fs = _open(opened, root, inline_io=False, max_read_bytes=100)
    real_read = os.read
    sizes: list[int] = []

    def read(fd: int, n: int) -> bytes:
        # Another writer appends between the adapter's fstat and each of its reads.
        with open(target, "ab") as more:
            more.write(b"+" * (1 << 20))
        sizes.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", read)
    exc = await _error(fs.read_bytes("data/grows", max_bytes=100))
    assert exc.code == "SAND_FS_TOO_LARGE"
    assert sum(sizes) <= 101  # never asked for more than the limit and one byte


# -- path strings ----------------------------------------------------------------------------


@pytest.mark.parametrize("use_openat2", MODES)
@pytest.mark.parametrize(
    "path",
    [
        "data/.",
        "data/./f",
        "data//f",
        "data/f/",
        "data/../data/f",
        "./data/f",
        "/data/f",
        "data/\0",
    ],
)
async def test_un_normalised_paths_are_refused_by_the_adapter_itself(
    root: Path, opened: list[BeneathRootFs], use_openat2: bool | None, path: str
) -> None:
    (root / "data" / "f").write_bytes(b"f")
    fs = _open(opened, root, use_openat2=use_openat2)
    for call in (
        fs.read_bytes(path, max_bytes=99),
        fs.write_bytes(path, b"w"),
        fs.list_dir(path),
        fs.exists(path),
    ):
        assert (await _error(call)).code == "SAND_FS_IO_ERROR"
    assert (root / "data" / "f").read_bytes() == b"f"
    assert _leftovers(root) == []


@pytest.mark.parametrize("use_openat2", MODES)
async def test_odd_names_are_exact_bytes_and_unlistable_names_never_reach_the_guest(
    root: Path, opened: list[BeneathRootFs], use_openat2: bool | None
) -> None:
    fs = _open(opened, root, use_openat2=use_openat2)
    nfc = unicodedata.normalize("NFC", "caf\u00e9")
    nfd = unicodedata.normalize("NFD", nfc)
    (root / "data" / nfd).write_bytes(b"the NFD file")
    (root / "data" / "Secret").write_bytes(b"upper")
    os.close(os.open(os.path.join(os.fsencode(root / "data"), b"bad\xff"), os.O_CREAT, 0o644))
    await fs.write_bytes("data/line\nbreak", b"nl")
    assert await fs.read_bytes("data/line\nbreak", max_bytes=9) == b"nl"
    # No normalisation and no case folding: another spelling is another (missing) file.
    assert (await _error(fs.read_bytes(f"data/{nfc}", max_bytes=99))).code == "SAND_FS_NOT_FOUND"
    assert (await _error(fs.read_bytes("data/secret", max_bytes=99))).code == "SAND_FS_NOT_FOUND"
    listed = await fs.list_dir("data")
    assert "bad\udcff" in listed  # the adapter reports the name as the OS gives it...
    shown = FsRuleSet(["./data/*"]).readable_entries("data", listed)
    assert "bad\udcff" not in shown  # ...and no request could name it, so no guest sees it
    assert sorted(shown) == sorted(["Secret", "line\nbreak", nfd])


# -- the write path --------------------------------------------------------------------------


@pytest.mark.parametrize("use_openat2", MODES)
def test_a_target_turned_into_a_directory_before_the_rename_leaves_nothing_behind(
    root: Path,
    opened: list[BeneathRootFs],
    monkeypatch: pytest.MonkeyPatch,
    use_openat2: bool | None,
) -> None:
    (root / "data" / "t").write_bytes(b"old")
    fs = _open(opened, root, use_openat2=use_openat2, max_root_bytes=64 * BLOCK)
    fs._write_sync("data/other", b"o")  # measured
    pause = _PauseBeforeRename(monkeypatch, "writer")
    codes: list[str] = []

    def write() -> None:
        try:
            fs._write_sync("data/t", b"n" * (3 * BLOCK))
        except SuaveplanError as exc:
            codes.append(exc.code)

    writer = threading.Thread(target=write, name="writer")
    writer.start()
    assert pause.paused.wait(30)
    (root / "data" / "t").unlink()  # a WASM guest sharing the subtree
    (root / "data" / "t").mkdir()
    pause.go.set()
    writer.join(30)
    assert codes == ["SAND_FS_NOT_A_FILE"]
    assert _leftovers(root) == []
    assert (root / "data" / "t").is_dir()
    assert fs._usage.used is not None and fs._usage.used >= _on_disk(root)


async def test_a_file_written_over_a_setuid_file_has_no_special_bits_whatever_the_umask(
    root: Path, opened: list[BeneathRootFs]
) -> None:
    target = root / "data" / "tool"
    target.write_bytes(b"#!/bin/sh\n")
    os.chmod(target, 0o6777 | stat.S_ISVTX)
    fs = _open(opened, root)
    old = os.umask(0)
    try:
        await fs.write_bytes("data/tool", b"replaced")
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(target).st_mode)
    assert mode == 0o644
    assert target.read_bytes() == b"replaced"


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("use_openat2", MODES)
async def test_no_coded_error_names_the_hosts_root_or_a_temp_file(
    root: Path, opened: list[BeneathRootFs], use_openat2: bool | None, tmp_path: Path
) -> None:
    (root / "data" / "link").symlink_to(tmp_path)
    (root / "data" / "dir").mkdir()
    os.mkfifo(root / "data" / "fifo")
    (root / "data" / "big").write_bytes(b"b" * 200)
    fs = _open(opened, root, use_openat2=use_openat2, max_read_bytes=100, max_write_bytes=100)
    errors = [
        await _error(fs.read_bytes("data/missing", max_bytes=99)),
        await _error(fs.read_bytes("data/link/x", max_bytes=99)),
        await _error(fs.read_bytes("data/dir", max_bytes=99)),
        await _error(fs.read_bytes("data/fifo", max_bytes=99)),
        await _error(fs.read_bytes("data/big", max_bytes=99)),
        await _error(fs.read_bytes("data/" + "n" * 300, max_bytes=99)),  # ENAMETOOLONG
        await _error(fs.write_bytes("data/dir", b"x")),
        await _error(fs.write_bytes("data/missing/x", b"x")),
        await _error(fs.write_bytes("data/x", b"x" * 101)),
        await _error(fs.list_dir("data/fifo")),
    ]
    codes = {exc.code for exc in errors}
    assert codes <= {
        "SAND_FS_NOT_FOUND",
        "SAND_FS_LINK_REFUSED",
        "SAND_FS_NOT_A_FILE",
        "SAND_FS_TOO_LARGE",
        "SAND_FS_IO_ERROR",
    }
    for exc in errors:
        wire = json.dumps(exc.to_wire())
        assert str(tmp_path) not in wire and "suaveplan-tmp" not in wire, wire


async def test_many_concurrent_writes_never_pass_the_quota(
    root: Path, opened: list[BeneathRootFs]
) -> None:
    fs = _open(opened, root, max_root_bytes=16 * BLOCK)
    (root / "data" / "big").write_bytes(b"b" * (8 * BLOCK))

    async def one(i: int) -> None:
        try:
            if i % 3 == 0:
                await fs.write_bytes("data/big", b"s" * (i % 5))
            else:
                await fs.write_bytes(f"data/f{i % 7}", b"x" * (BLOCK * (i % 4)))
        except SuaveplanError as exc:
            assert exc.code == "SAND_FS_TOO_LARGE"

    await asyncio.gather(*(one(i) for i in range(60)))
    assert _on_disk(root) <= 16 * BLOCK
    assert fs._usage.used == _on_disk(root)
    assert _leftovers(root) == []
