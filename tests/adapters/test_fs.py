"""BeneathRootFs: links refused, rename races contained, atomic writes, limits, coded errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from suaveplan_sandbox.adapters import _fs
from suaveplan_sandbox.adapters._fs import BeneathRootFs
from suaveplan_sandbox.adapters._ready import Ready
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import speedups_status

MODES = [pytest.param(None, id="openat2"), pytest.param(False, id="per-component")]


@pytest.fixture(params=MODES)
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, BeneathRootFs]]:
    root = tmp_path / "root"
    (root / "uploads").mkdir(parents=True)
    (root / "uploads" / "a.txt").write_bytes(b"hello")
    (tmp_path / "outside.txt").write_bytes(b"CANARY")
    fs = BeneathRootFs(root, use_openat2=request.param, max_read_bytes=64, max_write_bytes=64)
    yield root, fs
    fs.close()


async def _code(coro: object) -> str:
    with pytest.raises(SuaveplanError) as info:
        await coro  # type: ignore[misc]
    return info.value.code


async def test_reads_writes_and_lists_beneath_the_root(tree: tuple[Path, BeneathRootFs]) -> None:
    root, fs = tree
    assert await fs.read_bytes("uploads/a.txt", max_bytes=10) == b"hello"
    await fs.write_bytes("uploads/b.txt", b"new")
    assert (root / "uploads" / "b.txt").read_bytes() == b"new"
    assert await fs.list_dir("uploads") == ["a.txt", "b.txt"]
    assert await fs.list_dir(".") == ["uploads"]
    assert await fs.exists("uploads/a.txt")
    assert not await fs.exists("uploads/missing")


async def test_a_symlink_to_etc_inside_uploads_is_refused(tree: tuple[Path, BeneathRootFs]) -> None:
    root, fs = tree
    (root / "uploads" / "etc").symlink_to("/etc")
    assert await _code(fs.read_bytes("uploads/etc/passwd", max_bytes=64)) == "SAND_FS_LINK_REFUSED"
    assert await _code(fs.list_dir("uploads/etc")) == "SAND_FS_LINK_REFUSED"
    assert await _code(fs.write_bytes("uploads/etc/x", b"x")) == "SAND_FS_LINK_REFUSED"


async def test_a_symlink_to_dotdot_is_refused(tree: tuple[Path, BeneathRootFs]) -> None:
    root, fs = tree
    (root / "uploads" / "up").symlink_to("../..")
    assert await _code(fs.read_bytes("uploads/up/outside.txt", max_bytes=64)) == (
        "SAND_FS_LINK_REFUSED"
    )


async def test_a_file_symlink_is_refused_even_inside_the_root(
    tree: tuple[Path, BeneathRootFs],
) -> None:
    root, fs = tree
    (root / "uploads" / "out.txt").symlink_to(root.parent / "outside.txt")
    (root / "uploads" / "in.txt").symlink_to("a.txt")
    assert await _code(fs.read_bytes("uploads/out.txt", max_bytes=64)) == "SAND_FS_LINK_REFUSED"
    assert await _code(fs.read_bytes("uploads/in.txt", max_bytes=64)) == "SAND_FS_LINK_REFUSED"
    assert not await fs.exists("uploads/out.txt")


async def test_writing_over_a_planted_link_replaces_the_link_not_its_target(
    tree: tuple[Path, BeneathRootFs],
) -> None:
    root, fs = tree
    link = root / "uploads" / "planted"
    link.symlink_to(root.parent / "outside.txt")
    await fs.write_bytes("uploads/planted", b"mine")
    assert (root.parent / "outside.txt").read_bytes() == b"CANARY"
    assert not link.is_symlink()
    assert link.read_bytes() == b"mine"


async def test_missing_directory_and_limits_have_codes(tree: tuple[Path, BeneathRootFs]) -> None:
    root, fs = tree
    assert await _code(fs.read_bytes("uploads/nope", max_bytes=64)) == "SAND_FS_NOT_FOUND"
    assert await _code(fs.list_dir("nope")) == "SAND_FS_NOT_FOUND"
    assert await _code(fs.read_bytes("uploads", max_bytes=64)) == "SAND_FS_NOT_A_FILE"
    assert await _code(fs.list_dir("uploads/a.txt")) == "SAND_FS_NOT_A_FILE"
    assert await _code(fs.write_bytes("uploads", b"x")) == "SAND_FS_NOT_A_FILE"
    assert await _code(fs.read_bytes("uploads/a.txt", max_bytes=4)) == "SAND_FS_TOO_LARGE"
    (root / "uploads" / "big").write_bytes(b"x" * 65)
    assert await _code(fs.read_bytes("uploads/big", max_bytes=1000)) == "SAND_FS_TOO_LARGE"
    assert await _code(fs.write_bytes("uploads/c", b"x" * 65)) == "SAND_FS_TOO_LARGE"
    assert not (root / "uploads" / "c").exists()


async def test_a_fifo_is_not_a_file_and_does_not_hang(tree: tuple[Path, BeneathRootFs]) -> None:
    root, fs = tree
    os.mkfifo(root / "uploads" / "fifo")
    assert await _code(fs.read_bytes("uploads/fifo", max_bytes=64)) == "SAND_FS_NOT_A_FILE"


@pytest.mark.parametrize("reader", ["thread", "inline"])
def test_a_rename_race_between_directory_and_symlink_never_escapes(
    tree: tuple[Path, BeneathRootFs], reader: str
) -> None:
    # "inline": the read answered from the kernel's caches on the caller's thread, which
    # declines (None) whenever it cannot answer; it must never answer with the outside file.
    root, fs = tree
    read = fs._read_sync if reader == "thread" else fs._read_cached
    outside = root.parent / "secret"
    outside.mkdir()
    (outside / "f.txt").write_bytes(b"CANARY")
    swap = root / "uploads" / "swap"
    real = root / "uploads" / "real"
    real.mkdir()
    (real / "f.txt").write_bytes(b"inside")
    stop = threading.Event()

    def swapper() -> None:
        # Alternate `swap` between a real directory and a link pointing outside the root.
        while not stop.is_set():
            os.rename(real, swap)
            os.rename(swap, real)
            swap.symlink_to(outside)
            os.unlink(swap)

    thread = threading.Thread(target=swapper)
    thread.start()
    seen: set[bytes | None] = set()
    try:
        # Until a read has come through the race as well: how often the swapper runs between
        # two reads varies with load and the GIL, so yield to it on each attempt and bound
        # the loop by attempts, not by a fixed count.
        for attempt in range(100_000):
            if attempt >= 3000 and b"inside" in seen:
                break
            time.sleep(0)
            try:
                seen.add(read("uploads/swap/f.txt", 64))
            except SuaveplanError as exc:
                # NOT_A_FILE: the per-component walk saw a link, then a directory on re-stat.
                assert exc.code in {
                    "SAND_FS_LINK_REFUSED",
                    "SAND_FS_NOT_FOUND",
                    "SAND_FS_NOT_A_FILE",
                }
    finally:
        stop.set()
        thread.join()
    assert b"CANARY" not in seen
    assert b"inside" in seen  # the race let reads through, and they found the real file


_KILLED_WRITER = """
import asyncio, os, sys, time
from suaveplan_sandbox.adapters._fs import BeneathRootFs
real_fsync = os.fsync
def stall(fd):
    real_fsync(fd)
    sys.stdout.write("mid-write\\n"); sys.stdout.flush()
    time.sleep(60)
os.fsync = stall
fs = BeneathRootFs(sys.argv[1], max_write_bytes=1 << 24)
asyncio.run(fs.write_bytes("data.bin", b"N" * (1 << 20)))
"""


def test_a_writer_killed_mid_write_leaves_the_old_file_intact(tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_bytes(b"OLD")
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"mid-write\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (tmp_path / "data.bin").read_bytes() == b"OLD"
    fs = BeneathRootFs(tmp_path)
    try:
        # The orphaned temp file is hidden-named and never becomes the target.
        assert fs._read_sync("data.bin", 10) == b"OLD"
    finally:
        fs.close()


async def test_links_a_guest_creates_in_a_writable_directory_are_refused(
    tree: tuple[Path, BeneathRootFs],
) -> None:
    # A WASI guest with `rw:` can call path_symlink inside its preopen; whatever it plants,
    # the adapter's next open must not follow it (file link, directory link, relative or not).
    root, fs = tree
    await fs.write_bytes("uploads/mine.txt", b"mine")
    out = root / "uploads"
    (out / "to-outside").symlink_to("../../outside.txt")
    (out / "to-mine").symlink_to("mine.txt")
    (out / "dir-up").symlink_to("..")
    (out / "dir-abs").symlink_to(root.parent)
    for path in ("uploads/to-outside", "uploads/to-mine", "uploads/dir-up/uploads/a.txt"):
        assert await _code(fs.read_bytes(path, max_bytes=64)) == "SAND_FS_LINK_REFUSED", path
    for path in ("uploads/dir-up", "uploads/dir-abs"):
        assert await _code(fs.list_dir(path)) == "SAND_FS_LINK_REFUSED", path
    assert await _code(fs.write_bytes("uploads/dir-abs/outside.txt", b"x")) == (
        "SAND_FS_LINK_REFUSED"
    )
    assert await _code(fs.write_bytes("uploads/dir-up/new.txt", b"x")) == "SAND_FS_LINK_REFUSED"
    assert (root.parent / "outside.txt").read_bytes() == b"CANARY"
    assert not (root / "new.txt").exists()
    assert not await fs.exists("uploads/to-mine")


def test_a_rename_race_during_writes_never_writes_outside_the_root(
    tree: tuple[Path, BeneathRootFs],
) -> None:
    root, fs = tree
    outside = root.parent / "target"
    outside.mkdir()
    swap = root / "uploads" / "swap"
    real = root / "uploads" / "real"
    real.mkdir()
    stop = threading.Event()
    swaps = [0]

    def swapper() -> None:
        while not stop.is_set():
            os.rename(real, swap)
            os.rename(swap, real)
            swap.symlink_to(outside)
            os.unlink(swap)
            swaps[0] += 1

    thread = threading.Thread(target=swapper)
    thread.start()
    try:
        # Run until the swapper has really raced: rounds vary with load and the GIL, so
        # yield it on each attempt and bound the loop by attempts, not by a fixed count.
        for attempt in range(100_000):
            if attempt >= 300 and swaps[0] >= 50:
                break
            time.sleep(0)
            try:
                fs._write_sync("uploads/swap/f.txt", b"written")
            except SuaveplanError as exc:
                assert exc.code in {
                    "SAND_FS_LINK_REFUSED",
                    "SAND_FS_NOT_FOUND",
                    "SAND_FS_NOT_A_FILE",
                }
    finally:
        stop.set()
        thread.join()
    assert swaps[0] >= 50  # the race really ran
    assert list(outside.iterdir()) == []


class _CloseRace:
    """Two roots, `mine` (the adapter's) and `theirs`, each with `data/f.txt`. A read is
    paused (by the test's patch calling `pause`) where it holds `mine`'s root fd and is about
    to resolve a path against it; the host then closes the adapter (a sandbox disposed
    mid-call) and opens another sandbox's root. Had close() released the fd, `theirs` would
    get its number (the lowest free one) and the read would resolve beneath it."""

    def __init__(self, tmp_path: Path) -> None:
        self.mine, self.theirs = tmp_path / "mine", tmp_path / "theirs"
        for root, text in ((self.mine, b"mine"), (self.theirs, b"THEIRS")):
            (root / "data").mkdir(parents=True)
            (root / "data" / "f.txt").write_bytes(text)
            (root / "data" / "f.txt").read_bytes()  # in the caches: either could be answered
        self.paused, self.resume = threading.Event(), threading.Event()

    def pause(self) -> None:
        self.paused.set()
        self.resume.wait(10)

    def run(self, fs: BeneathRootFs, read: Callable[[], object]) -> None:
        number = fs._root_fd
        seen: list[object] = []
        reader = threading.Thread(target=lambda: seen.append(read()))
        reader.start()
        assert self.paused.wait(10)
        fs.close()
        other = os.open(self.theirs, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.resume.set()
            reader.join(10)
        finally:
            os.close(other)
        assert seen == [b"mine"]
        assert other != number  # the number stayed the adapter's while the read held it
        try:  # and the last holder closed it: closed, or reused for something else
            st = os.fstat(number)
        except OSError:
            return
        mine = self.mine.stat()
        assert (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino)


@pytest.mark.parametrize(
    "mode", [pytest.param(None, id="openat2"), pytest.param(False, id="per-component")]
)
def test_close_during_a_read_never_lets_another_root_take_the_fd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: bool | None
) -> None:
    race = _CloseRace(tmp_path)
    fs = BeneathRootFs(race.mine, use_openat2=mode)
    resolve = fs._open_dir_from

    def slow(root: int, parts: list[str]) -> int:
        race.pause()
        return resolve(root, parts)

    monkeypatch.setattr(fs, "_open_dir_from", slow)
    race.run(fs, lambda: fs._read_sync("data/f.txt", 64))
    with pytest.raises(SuaveplanError) as info:
        fs._read_sync("data/f.txt", 64)
    assert info.value.code == "SAND_FS_IO_ERROR"


@pytest.mark.parametrize("twin", ["python", "c"])
def test_close_during_an_inline_read_never_lets_another_root_take_the_fd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, twin: str
) -> None:
    # The same race on the inline path, which resolves against the root fd on the caller's
    # thread (the host's loop) with `openat2(RESOLVE_CACHED)`: in Python, paused inside its
    # first system call; in C (`_speedups.read_cached`), paused as the call is made, the
    # root's fd number already in its arguments.
    race = _CloseRace(tmp_path)
    fs = BeneathRootFs(race.mine)
    read_c = fs._read_cached_c
    if twin == "python":
        fs._read_cached_c = None
    elif read_c is None:  # not built, or switched off: the Python case is the one in use
        assert speedups_status()["fs_read"] is False
        fs.close()
        return
    if not fs.inline_io:  # no inline path on this kernel or filesystem: every read is threaded
        call = fs.read_bytes("data/f.txt", max_bytes=64)
        assert type(call) is not Ready
        call.close()
        fs.close()
        return
    assert fs._read_cached("data/f.txt", 64) == b"mine"
    syscall = _fs.SYSCALL  # type: ignore[attr-defined]
    assert syscall is not None
    reader: list[int] = []

    def slow(*args: object) -> int:
        if threading.get_ident() in reader:
            race.pause()
        return int(syscall(*args))

    def read() -> object:
        reader.append(threading.get_ident())
        return fs._read_cached("data/f.txt", 64)

    def slow_c(root: int, *args: Any) -> bytes | None:
        if threading.get_ident() in reader:
            race.pause()
        assert read_c is not None
        return read_c(root, *args)

    if twin == "python":
        monkeypatch.setattr(_fs, "SYSCALL", slow)
    else:
        fs._read_cached_c = slow_c
    race.run(fs, read)
    assert fs._read_cached("data/f.txt", 64) is None  # closed: declined, and the thread refuses
