"""BeneathRootFs against what a plugin, or whoever else writes in its root, can put there:
special files, terminals, huge directories, long names, hard links, and writes cancelled
while the filesystem hangs."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import threading
import tracemalloc
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import _fs
from suaveplan_sandbox.adapters._fs import BeneathRootFs
from suaveplan_sandbox.adapters._openat2 import HOW_READ
from suaveplan_sandbox.errors import SuaveplanError

MODES = [pytest.param(None, id="openat2"), pytest.param(False, id="per-component")]
_IN_OPEN = 0x20


async def _code(coro: object) -> str:
    with pytest.raises(SuaveplanError) as info:
        await coro  # type: ignore[misc]
    return info.value.code


class _OpenWatch:
    """The names in one directory that anything opened (inotify `IN_OPEN`) since the last
    look. An `O_PATH` open or a `stat` is no open: no driver runs for those."""

    def __init__(self, directory: Path) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self._fd >= 0
        assert self._libc.inotify_add_watch(self._fd, os.fsencode(directory), _IN_OPEN) >= 0

    def opened(self) -> set[str]:
        names: set[str] = set()
        while True:
            try:
                buf = os.read(self._fd, 65536)
            except BlockingIOError:
                return names
            at = 0
            while at < len(buf):
                _, mask, _, size = struct.unpack_from("iIII", buf, at)
                name = buf[at + 16 : at + 16 + size].rstrip(b"\0")
                if mask & _IN_OPEN and name:
                    names.add(os.fsdecode(name))
                at += 16 + size

    def close(self) -> None:
        os.close(self._fd)


def _plant(directory: Path, kind: str) -> Iterator[str]:
    """Make a special file named `kind` in `directory` and yield its name (a socket stays
    bound meanwhile)."""
    path = directory / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        try:  # a /dev/null twin: safe to open, which is the point of the test
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:  # no CAP_MKNOD here: a FIFO is as special a file
            os.mkfifo(path)
    else:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
            yield kind
        return
    yield kind


@pytest.mark.parametrize("kind", ["fifo", "device", "socket"])
@pytest.mark.parametrize(
    "config",
    [
        pytest.param({}, id="inline"),
        pytest.param({"inline_io": False}, id="openat2-thread"),
        pytest.param({"use_openat2": False}, id="per-component"),
    ],
)
async def test_reading_a_special_file_never_opens_it(
    tmp_path: Path, kind: str, config: dict[str, bool]
) -> None:
    # Opening runs the file's driver: a writer waiting on a FIFO is let go (and then gets
    # EPIPE), a device does whatever its open does, possibly on the event loop.
    fs = BeneathRootFs(tmp_path, **config)
    watch = _OpenWatch(tmp_path)
    try:
        for name in _plant(tmp_path, kind):
            for _ in range(2):  # the second time, the lookup is in the kernel's caches
                assert await _code(fs.read_bytes(name, max_bytes=64)) == "SAND_FS_NOT_A_FILE"
                assert not await fs.exists(name)
                assert name in await fs.list_dir(".")
            assert name not in watch.opened()
    finally:
        watch.close()
        fs.close()


_PLANTED_TERMINAL = """
import json, os, subprocess, sys
from suaveplan_sandbox.adapters import _fs
from suaveplan_sandbox.adapters._fs import BeneathRootFs
from suaveplan_sandbox.errors import SuaveplanError

def controlling_terminal():
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY))
    except OSError as exc:
        return exc.errno
    return "yes"

root, mode = sys.argv[1], sys.argv[2]
master, slave = os.openpty()
name = os.ttyname(slave)
os.close(slave)
# Someone else's terminal, in the root: a pty slave can be opened only through its devpts,
# so it is bind-mounted over an empty file (in this process's private mount namespace).
open(os.path.join(root, "tty"), "wb").close()
subprocess.run(["mount", "--bind", name, os.path.join(root, "tty")], check=True)
seen = {"leader": os.getsid(0) == os.getpid(), "before": controlling_terminal()}
fs = BeneathRootFs(root, use_openat2=None if mode == "openat2" else False)
try:
    fs._read_sync("tty", 64)
except SuaveplanError as exc:
    seen["code"] = exc.code
seen["after"] = controlling_terminal()
print(json.dumps(seen))
"""


@pytest.mark.parametrize("mode", ["openat2", "per-component"])
def test_a_terminal_in_the_root_never_becomes_the_hosts_controlling_terminal(
    tmp_path: Path, mode: str
) -> None:
    # A host run as a service is a session leader without a terminal. Opening a terminal
    # without O_NOCTTY makes it the host's controlling terminal, and whoever holds its
    # master side can then send the host SIGINT (^C) and SIGHUP (by closing it).
    unshare = shutil.which("unshare")
    private = unshare is not None and (
        subprocess.run([unshare, "-m", "true"], capture_output=True, check=False).returncode == 0
    )
    if unshare is None or not private:
        # No private mount namespace here (not root, or no util-linux): hold what would be
        # shown, that a read never opens a terminal as the controlling one.
        assert HOW_READ.contents.flags & os.O_NOCTTY
        return
    out = subprocess.run(
        [unshare, "-m", sys.executable, "-c", _PLANTED_TERMINAL, str(tmp_path), mode],
        capture_output=True,
        text=True,
        check=True,
        start_new_session=True,  # a session leader without a controlling terminal
    )
    seen = json.loads(out.stdout)
    assert seen["leader"] is True
    assert seen["before"] != "yes"  # ENXIO: no controlling terminal to begin with
    assert seen["code"] == "SAND_FS_NOT_A_FILE"
    assert seen["after"] == seen["before"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_listing_longer_than_max_list_entries_is_refused(
    tmp_path: Path, mode: bool | None
) -> None:
    for i in range(50):
        (tmp_path / f"f{i:02}").touch()
    fs = BeneathRootFs(tmp_path, max_list_entries=50, use_openat2=mode)
    assert await fs.list_dir(".") == [f"f{i:02}" for i in range(50)]
    (tmp_path / "one-more").touch()
    assert await _code(fs.list_dir(".")) == "SAND_FS_TOO_LARGE"
    fs.close()


def test_a_huge_directory_is_refused_without_being_held_in_memory(tmp_path: Path) -> None:
    # 4,000 names of 200 bytes: ~1 MB as Python strings if the listing were built whole.
    for i in range(4000):
        (tmp_path / f"{i:05}{'x' * 195}").touch()
    fs = BeneathRootFs(tmp_path, max_list_entries=100)
    tracemalloc.start()
    try:
        with pytest.raises(SuaveplanError) as info:
            fs._list_sync(".")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        fs.close()
    assert info.value.code == "SAND_FS_TOO_LARGE"
    assert peak < 200_000


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "name",
    [
        pytest.param("é" * 127, id="254-bytes-of-2-byte-characters"),
        pytest.param("€" * 85, id="255-bytes-of-3-byte-characters"),
        pytest.param("a" * 255, id="255-bytes-of-ascii"),
        pytest.param("ab" + "€" * 40, id="cut-inside-a-character"),
    ],
)
async def test_a_name_of_up_to_255_bytes_in_any_characters_can_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: bool | None, name: str
) -> None:
    assert len(name.encode()) <= 255  # what the policy lets a request name
    temps: list[str] = []
    real_rename = os.rename

    def rename(src: str, dst: str, **fds: int) -> None:
        temps.append(src)
        real_rename(src, dst, **fds)

    monkeypatch.setattr(os, "rename", rename)
    fs = BeneathRootFs(tmp_path, use_openat2=mode)
    await fs.write_bytes(name, b"data")
    fs.close()
    assert (tmp_path / name).read_bytes() == b"data"
    # The temp file showed in listings meanwhile: its name is valid UTF-8 too.
    assert len(temps) == 1
    assert len(temps[0].encode("utf-8")) <= 255


@pytest.mark.parametrize("mode", MODES)
async def test_writing_over_a_hard_link_leaves_its_other_name_untouched(
    tmp_path: Path, mode: bool | None
) -> None:
    # A hard link to a file outside the root cannot be made by the plugin, but may exist.
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"CANARY")
    os.link(outside, root / "linked")
    fs = BeneathRootFs(root, use_openat2=mode)
    await fs.write_bytes("linked", b"mine")
    fs.close()
    assert (root / "linked").read_bytes() == b"mine"
    assert outside.read_bytes() == b"CANARY"
    assert outside.stat().st_nlink == 1


@pytest.mark.parametrize("kind", ["fifo", "device", "socket"])
async def test_writing_over_a_special_file_replaces_it_without_opening_it(
    tmp_path: Path, kind: str
) -> None:
    fs = BeneathRootFs(tmp_path)
    watch = _OpenWatch(tmp_path)
    try:
        for name in _plant(tmp_path, kind):
            await fs.write_bytes(name, b"data")
            assert name not in watch.opened()
            assert (tmp_path / name).read_bytes() == b"data"
    finally:
        watch.close()
        fs.close()


class _HungRename:
    """`os.rename` on a filesystem that stops answering for the first rename only, until
    `release` (or 5 s, the bound on how long a broken adapter holds the test)."""

    def __init__(self) -> None:
        self.real = os.rename
        self.entered, self.release, self.returned = (threading.Event() for _ in range(3))
        self.sources: list[str] = []

    def __call__(self, src: str, dst: str, **fds: int) -> None:
        self.sources.append(src)
        first = len(self.sources) == 1
        if first:
            self.entered.set()
            self.release.wait(5)
        self.real(src, dst, **fds)
        if first:
            self.returned.set()


class _WatchedLocks:
    """Wraps the rename lock each write takes, telling when one has to wait for it."""

    def __init__(self, real: Callable[[int], _fs._RenameLock]) -> None:
        self.real = real
        self.waited = threading.Event()

    def __call__(self, dir_fd: int) -> _WatchedLocks.Lock:
        return self.Lock(self.real(dir_fd), self.waited)

    class Lock:
        def __init__(self, inner: _fs._RenameLock, waited: threading.Event) -> None:
            self.inner, self.waited = inner, waited

        def __enter__(self) -> None:
            if not self.inner.lock.acquire(blocking=False):
                self.waited.set()
                self.inner.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self.inner.lock.release()


async def test_cancelling_a_write_whose_rename_hangs_never_blocks_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The gateway cancels in-flight calls when a sandbox crashes or is disposed. A write
    # already renaming cannot be stopped; on a hung filesystem (NFS, FUSE) that rename may
    # not return for minutes, and the cancellation must not wait for it on the loop.
    (tmp_path / "doc").write_bytes(b"old")
    hung = _HungRename()
    monkeypatch.setattr(os, "rename", hung)
    locks = _WatchedLocks(_fs._RENAME_LOCKS.get)
    monkeypatch.setattr(_fs, "_RENAME_LOCKS", types.SimpleNamespace(get=locks))
    # The restarted sandbox writes through an adapter of its own on the same root.
    crashed, restarted = BeneathRootFs(tmp_path), BeneathRootFs(tmp_path)
    try:
        first = asyncio.ensure_future(crashed.write_bytes("doc", b"first"))
        assert await asyncio.to_thread(hung.entered.wait, 10)
        first.cancel()
        await asyncio.wait([first])
        assert first.cancelled()
        assert not hung.returned.is_set()  # the loop ran on while the rename hung
        # The next sandbox's write, acknowledged once it lands, must land after the
        # cancelled one, or that one would silently replace it.
        second = asyncio.ensure_future(restarted.write_bytes("doc", b"second"))
        assert await asyncio.to_thread(locks.waited.wait, 10)
        assert not second.done()
        hung.release.set()
        await second
        assert hung.returned.is_set()
        assert (tmp_path / "doc").read_bytes() == b"second"
        assert [p.name for p in tmp_path.iterdir()] == ["doc"]  # no temp file left
    finally:
        hung.release.set()
        crashed.close()
        restarted.close()


async def test_a_write_cancelled_before_its_rename_never_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "doc").write_bytes(b"old")
    real_fsync = os.fsync
    entered, release = threading.Event(), threading.Event()

    def hung_fsync(fd: int) -> None:  # the data's fsync, before the rename is decided
        entered.set()
        release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", hung_fsync)
    fs = BeneathRootFs(tmp_path)
    try:
        write = asyncio.ensure_future(fs.write_bytes("doc", b"new"))
        assert await asyncio.to_thread(entered.wait, 10)
        write.cancel()
        await asyncio.wait([write])
        release.set()
        for _ in range(1000):  # the thread unwinds on its own time: its temp file goes
            if [p.name for p in tmp_path.iterdir()] == ["doc"]:
                break
            await asyncio.sleep(0.01)
        assert [p.name for p in tmp_path.iterdir()] == ["doc"]
        assert (tmp_path / "doc").read_bytes() == b"old"
    finally:
        release.set()
        fs.close()


async def test_a_read_hung_in_the_filesystem_is_cancelled_and_closed_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "doc").write_bytes(b"data")
    real_read = os.read
    entered, release = threading.Event(), threading.Event()

    def hung_read(fd: int, size: int) -> bytes:
        entered.set()
        release.wait(10)
        return real_read(fd, size)

    monkeypatch.setattr(os, "read", hung_read)
    fs = BeneathRootFs(tmp_path, inline_io=False)
    try:
        read = asyncio.ensure_future(fs.read_bytes("doc", max_bytes=64))
        assert await asyncio.to_thread(entered.wait, 10)
        read.cancel()
        await asyncio.wait([read])
        assert read.cancelled()
        fs.close()  # at once, though the read still hangs on its thread
        assert await _code(fs.read_bytes("doc", max_bytes=64)) == "SAND_FS_IO_ERROR"
        assert not release.is_set()
    finally:
        release.set()
        fs.close()


async def test_concurrent_writes_to_one_file_leave_one_of_them_whole(tmp_path: Path) -> None:
    fs = BeneathRootFs(tmp_path, max_write_bytes=1 << 20)
    bodies = [bytes([i]) * (64 * 1024 + i) for i in range(8)]
    try:
        await asyncio.gather(*(fs.write_bytes("doc", body) for body in bodies))
        reads = [fs.read_bytes("doc", max_bytes=1 << 20) for _ in range(4)]
        assert {await r for r in reads} <= set(bodies)
    finally:
        fs.close()
    assert (tmp_path / "doc").read_bytes() in bodies
    assert [p.name for p in tmp_path.iterdir()] == ["doc"]
