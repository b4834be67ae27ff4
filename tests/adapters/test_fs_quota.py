"""BeneathRootFs's `max_root_bytes`: the files beneath the root are held to a quota, counted in
4 KiB blocks, measured once and then tracked by every adapter on the root; a write past it is
refused before anything is replaced."""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters import _fs_quota
from suaveplan_sandbox.adapters._fs import BeneathRootFs, _WriteTicket
from suaveplan_sandbox.errors import SuaveplanError

BLOCK = 4096


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "root"
    (folder / "data").mkdir(parents=True)
    return folder


@pytest.fixture
def opened() -> Iterator[list[BeneathRootFs]]:
    """Adapters a test opens, closed after it."""
    adapters: list[BeneathRootFs] = []
    yield adapters
    for fs in adapters:
        fs.close()


def _fs(opened: list[BeneathRootFs], root: Path, **kwargs: object) -> BeneathRootFs:
    fs = BeneathRootFs(root, **kwargs)  # type: ignore[arg-type]
    opened.append(fs)
    return fs


async def _refused(fs: BeneathRootFs, path: str, data: bytes) -> dict[str, object]:
    with pytest.raises(SuaveplanError) as info:
        await fs.write_bytes(path, data)
    assert info.value.code == "SAND_FS_TOO_LARGE"
    return dict(info.value.details)


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".suaveplan-tmp")]


async def test_a_write_past_the_quota_is_refused_and_the_old_file_survives(
    root: Path, opened: list[BeneathRootFs]
) -> None:
    (root / "data" / "a.txt").write_bytes(b"hello")  # one block
    fs = _fs(opened, root, max_root_bytes=3 * BLOCK)
    await fs.write_bytes("data/b.txt", b"x" * BLOCK)  # two blocks in all
    details = await _refused(fs, "data/a.txt", b"y" * (2 * BLOCK + 1))  # a.txt: 1 -> 3 blocks
    assert details == {"reason": "quota-exceeded", "max_root_bytes": 3 * BLOCK}
    assert (root / "data" / "a.txt").read_bytes() == b"hello"
    assert _leftovers(root / "data") == []
    await fs.write_bytes("data/a.txt", b"y" * (2 * BLOCK))  # 1 -> 2 blocks: exactly full
    assert (root / "data" / "a.txt").read_bytes() == b"y" * (2 * BLOCK)
    await _refused(fs, "data/c.txt", b"")


async def test_files_already_beneath_the_root_count_links_and_other_entries_do_not(
    root: Path, tmp_path: Path, opened: list[BeneathRootFs]
) -> None:
    (root / "data" / "deep").mkdir()
    (root / "data" / "deep" / "old.bin").write_bytes(b"o" * (2 * BLOCK + 10))  # three blocks
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"b" * (64 * BLOCK))
    (root / "data" / "to-file").symlink_to(outside / "big.bin")
    (root / "data" / "to-dir").symlink_to(outside)
    os.mkfifo(root / "data" / "fifo")
    fs = _fs(opened, root, max_root_bytes=5 * BLOCK)
    await fs.write_bytes("data/one", b"1")
    await fs.write_bytes("data/two", b"2")
    await _refused(fs, "data/three", b"3")


async def test_empty_files_are_charged_a_block_each(
    root: Path, opened: list[BeneathRootFs]
) -> None:
    fs = _fs(opened, root, max_root_bytes=3 * BLOCK)
    for name in ("a", "b", "c"):
        await fs.write_bytes(f"data/{name}", b"")
    await _refused(fs, "data/d", b"")
    assert sorted(os.listdir(root / "data")) == ["a", "b", "c"]


async def test_a_write_that_shrinks_is_allowed_past_the_quota_and_frees_room(
    root: Path, opened: list[BeneathRootFs]
) -> None:
    (root / "data" / "big").write_bytes(b"b" * (5 * BLOCK))
    fs = _fs(opened, root, max_root_bytes=2 * BLOCK)
    await _refused(fs, "data/new", b"n")
    await fs.write_bytes("data/big", b"small")
    await fs.write_bytes("data/new", b"n")
    assert (root / "data" / "new").read_bytes() == b"n"


async def test_adapters_on_one_root_share_its_total_quota_or_not(
    root: Path, opened: list[BeneathRootFs]
) -> None:
    first = _fs(opened, root, max_root_bytes=3 * BLOCK)
    await first.write_bytes("data/a", b"a")  # measured, one block
    second = _fs(opened, root, max_root_bytes=3 * BLOCK)  # a restarted sandbox's adapter
    unlimited = _fs(opened, root)  # and one without a quota
    await second.write_bytes("data/b", b"b")
    await unlimited.write_bytes("data/c", b"c")
    for fs in (first, second):
        await _refused(fs, "data/d", b"d")
    await unlimited.write_bytes("data/c", b"")  # still a block: nothing freed
    await _refused(first, "data/d", b"d")


def test_a_write_and_a_cancelled_write_leave_the_total_as_the_files_are(
    root: Path, opened: list[BeneathRootFs]
) -> None:
    fs = _fs(opened, root, max_root_bytes=1 * BLOCK)
    ticket = _WriteTicket()
    ticket.cancel()
    with pytest.raises(SuaveplanError) as info:
        fs._write_sync("data/a", b"a", ticket)
    assert info.value.code == "SAND_CANCELLED"
    fs._write_sync("data/b", b"b")  # the cancelled write's block was given back
    assert os.listdir(root / "data") == ["b"]


def test_two_writes_racing_to_create_one_file_count_it_once(
    root: Path, opened: list[BeneathRootFs], monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = _fs(opened, root, max_root_bytes=3 * BLOCK)
    fs._write_sync("data/first", b"f")  # measured: one block
    paused, go = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        # Pause the racing write between its reservation and its rename, once.
        if threading.current_thread().name == "racer" and not paused.is_set():
            paused.set()
            go.wait(30)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    racer = threading.Thread(target=fs._write_sync, args=("data/same", b"r"), name="racer")
    racer.start()
    assert paused.wait(30)
    # Both reserved a new file's block; this one creates it, so the racer replaces it.
    fs._write_sync("data/same", b"m")
    go.set()
    racer.join(30)
    assert (root / "data" / "same").read_bytes() == b"r"
    # Two files of a block each: one block is left, not none.
    fs._write_sync("data/last", b"l")
    with pytest.raises(SuaveplanError):
        fs._write_sync("data/over", b"o")


async def test_a_root_too_large_to_measure_refuses_writes_and_is_walked_once(
    root: Path, opened: list[BeneathRootFs], monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(11):
        (root / "data" / f"f{i}").write_bytes(b"")
    walks: list[int] = []
    real_measure = _fs_quota._measure

    def counted(root_fd: int, max_dir_entries: int) -> int:
        walks.append(max_dir_entries)
        return real_measure(root_fd, max_dir_entries)

    monkeypatch.setattr(_fs_quota, "_measure", counted)
    fs = _fs(opened, root, max_root_bytes=1 << 30, max_list_entries=10)
    for name in ("data/a", "b"):
        assert await _refused(fs, name, b"x") == {"reason": "quota-unmeasurable"}
    assert walks == [10]
    assert not (root / "b").exists()


async def test_the_entry_cap_bounds_the_whole_walk(
    root: Path, opened: list[BeneathRootFs], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_fs_quota, "MAX_SCAN_ENTRIES", 20)
    for d in range(3):
        (root / f"d{d}").mkdir()
        for i in range(8):  # 8 a directory (under max_list_entries), 27 entries in all
            (root / f"d{d}" / f"f{i}").write_bytes(b"")
    fs = _fs(opened, root, max_root_bytes=1 << 30)
    assert await _refused(fs, "data/a", b"x") == {"reason": "quota-unmeasurable"}


async def test_without_a_quota_nothing_is_measured(
    root: Path, opened: list[BeneathRootFs], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(root_fd: int, max_dir_entries: int) -> int:
        raise AssertionError("measured")

    monkeypatch.setattr(_fs_quota, "_measure", refuse)
    fs = _fs(opened, root)
    await fs.write_bytes("data/a", b"x" * (1 << 20))
    assert fs.max_root_bytes is None


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_max_root_bytes_is_a_positive_int(root: Path, value: object) -> None:
    with pytest.raises(SuaveplanError) as info:
        BeneathRootFs(root, max_root_bytes=value)  # type: ignore[arg-type]
    assert info.value.code == "SAND_INVALID_ARGUMENT"


async def test_each_write_is_still_capped_at_max_write_bytes(
    root: Path, opened: list[BeneathRootFs]
) -> None:
    fs = _fs(opened, root, max_write_bytes=100, max_root_bytes=1 << 30)
    await _refused(fs, "data/a", b"x" * 101)
    assert os.listdir(root / "data") == []


def test_measuring_a_directory_of_many_directories_holds_few_fds(root: Path) -> None:
    for i in range(300):
        (root / "data" / f"d{i}").mkdir()
        (root / "data" / f"d{i}" / "f").write_bytes(b"x")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # Room for a few dozen more fds: a walk holding one per directory found runs out.
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 40, hard))
        try:
            total = _fs_quota._measure(fd, 100_000)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    finally:
        os.close(fd)
    assert total == 300 * BLOCK
