"""BeneathRootFs answers from the kernel's caches on the caller's thread when it can, and
otherwise on a thread, with the same answers either way."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suaveplan_sandbox.adapters import _fs
from suaveplan_sandbox.adapters._fs import INLINE_READ_MAX_BYTES, LOCAL_FILESYSTEMS, BeneathRootFs
from suaveplan_sandbox.adapters._openat2 import (
    CACHED_RESOLVE,
    HOW_PATH,
    HOW_READ,
    PATH_FLAGS,
    READ_FLAGS,
    RESOLVE_NO_XDEV,
    filesystem_type,
)
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import speedups_status

_OPEN_ARGS = (PATH_FLAGS, READ_FLAGS, CACHED_RESOLVE)


def _speedups_built() -> bool:
    try:
        from suaveplan_sandbox import _speedups
    except ImportError:
        return False
    switched_off = os.environ.get("SUAVEPLAN_SANDBOX_NO_SPEEDUPS", "") not in ("", "0")
    return hasattr(_speedups, "read_cached") and not switched_off


NFS_MAGIC = 0x6969


def _kernel_at_least(major: int, minor: int) -> bool:
    release = os.uname().release.split("-")[0].split(".")
    return (int(release[0]), int(release[1])) >= (major, minor)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "data" / "sub").mkdir(parents=True)
    (root / "data" / "a.bin").write_bytes(b"a" * 1024)
    (root / "data" / "empty").write_bytes(b"")
    (root / "data" / "big").write_bytes(b"b" * (INLINE_READ_MAX_BYTES + 1))
    (root / "data" / "limit").write_bytes(b"l" * 100)
    (root / "data" / "link").symlink_to("a.bin")
    (root / "data" / "dirlink").symlink_to("sub")
    (tmp_path / "outside").write_bytes(b"CANARY")
    (root / "data" / "out").symlink_to(tmp_path / "outside")
    os.mkfifo(root / "data" / "fifo")
    return root


@pytest.fixture
def both(root: Path) -> Iterator[tuple[BeneathRootFs, BeneathRootFs]]:
    inline, threaded = (
        BeneathRootFs(root, max_read_bytes=50_000_000),
        BeneathRootFs(root, max_read_bytes=50_000_000, inline_io=False),
    )
    yield inline, threaded
    inline.close()
    threaded.close()


async def _first_step(coro: Coroutine[Any, Any, object]) -> tuple[bool, object]:
    """(True, result or error) when `coro` finished in its first step, without suspending;
    (False, None) when it suspended (it is closed once what it waited for is done)."""
    try:
        step = coro.send(None)
    except StopIteration as stop:
        return True, stop.value
    except SuaveplanError as exc:
        return True, exc
    if isinstance(step, asyncio.Future):  # the thread's answer, collected so none is lost
        await asyncio.wait([step])
        if not step.cancelled():
            step.exception()
    coro.close()
    return False, None


async def _outcome(coro: Coroutine[Any, Any, object]) -> object:
    try:
        return await coro
    except SuaveplanError as exc:
        return exc.code


def test_inline_io_is_on_where_the_kernel_and_filesystem_can_promise_no_wait(root: Path) -> None:
    fs = BeneathRootFs(root)
    expected = (
        fs.uses_openat2
        and _kernel_at_least(5, 12)
        and hasattr(os, "RWF_NOWAIT")
        and filesystem_type(os.open(root, os.O_RDONLY)) in LOCAL_FILESYSTEMS
    )
    assert fs.inline_io is expected
    assert f"inline_io={expected}" in repr(fs)
    assert BeneathRootFs(root, inline_io=False).inline_io is False
    assert BeneathRootFs(root, use_openat2=False).inline_io is False


def test_a_root_on_a_network_filesystem_always_uses_the_thread(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_fs, "filesystem_type", lambda fd: NFS_MAGIC)
    assert BeneathRootFs(root).inline_io is False
    monkeypatch.setattr(_fs, "filesystem_type", lambda fd: None)  # fstatfs failed
    assert BeneathRootFs(root).inline_io is False


async def test_a_small_cached_file_is_read_without_leaving_the_callers_thread(
    both: tuple[BeneathRootFs, BeneathRootFs],
) -> None:
    inline, threaded = both
    await threaded.read_bytes("data/a.bin", max_bytes=4096)  # in the page cache now
    done, value = await _first_step(inline.read_bytes("data/a.bin", max_bytes=4096))
    assert (done, value) == ((True, b"a" * 1024) if inline.inline_io else (False, None))
    assert await _first_step(threaded.read_bytes("data/a.bin", max_bytes=4096)) == (False, None)
    done, value = await _first_step(inline.exists("data/a.bin"))
    assert (done, value) == ((True, True) if inline.inline_io else (False, None))


@pytest.mark.parametrize("cache", ["miss", "partial"])
async def test_a_file_not_wholly_in_the_page_cache_is_read_on_the_thread(
    both: tuple[BeneathRootFs, BeneathRootFs], monkeypatch: pytest.MonkeyPatch, cache: str
) -> None:
    # What `preadv(..., RWF_NOWAIT)` does when pages are missing: EAGAIN, or a short read up
    # to the first missing page. (Evicting pages for real is only advice to the kernel, and
    # a missed RWF_NOWAIT read starts readahead, so the next look finds them.)
    inline, _ = both
    inline._read_cached_c = None  # the Python reference, whose os.preadv this replaces
    real_preadv = os.preadv

    def uncached(fd: int, buffers: list[bytearray], offset: int, flags: int = 0) -> int:
        if flags & os.RWF_NOWAIT:
            if cache == "miss":
                raise BlockingIOError(11, "Resource temporarily unavailable")
            return real_preadv(fd, [memoryview(buffers[0])[:512]], offset, flags)
        return real_preadv(fd, buffers, offset, flags)

    monkeypatch.setattr(os, "preadv", uncached)
    assert await _first_step(inline.read_bytes("data/a.bin", max_bytes=4096)) == (False, None)
    assert await inline.read_bytes("data/a.bin", max_bytes=4096) == b"a" * 1024


@pytest.mark.parametrize(
    ("path", "max_bytes"),
    [
        ("data/a.bin", 4096),
        ("data/empty", 16),
        ("data/big", 10 * INLINE_READ_MAX_BYTES),  # too big to copy on the caller's thread
        ("data/limit", 99),  # one byte over the caller's limit
        ("data/limit", 100),
        ("data/link", 4096),
        ("data/out", 4096),
        ("data/dirlink/x", 4096),
        ("data/sub", 4096),
        ("data/fifo", 4096),
        ("data/missing", 4096),
        ("missing/a.bin", 4096),
        ("data/a.bin/x", 4096),
        ("data/../data/a.bin", 4096),
        ("data//a.bin", 4096),
        ("./data/a.bin", 4096),
        (".", 4096),
    ],
)
async def test_reads_answer_the_same_inline_or_on_the_thread(
    both: tuple[BeneathRootFs, BeneathRootFs], path: str, max_bytes: int
) -> None:
    inline, threaded = both
    for _ in range(2):  # the second time, whatever the first looked up is cached
        expected = await _outcome(threaded.read_bytes(path, max_bytes=max_bytes))
        assert await _outcome(inline.read_bytes(path, max_bytes=max_bytes)) == expected
    assert expected != b"CANARY"
    done, _ = await _first_step(inline.read_bytes(path, max_bytes=max_bytes))
    # Only a small regular file within the limits is ever answered without the thread.
    small = {("data/a.bin", 4096), ("data/empty", 16), ("data/limit", 100)}
    assert done is (inline.inline_io and (path, max_bytes) in small)


@pytest.mark.parametrize(
    "path",
    [
        "data/a.bin",
        "data/sub",
        "data",
        "data/missing",
        "missing/a.bin",
        "data/link",
        "data/out",
        "data/dirlink/x",
        "data/fifo",
        "data/a.bin/x",
        "data/../data/a.bin",
        ".",
    ],
)
async def test_existence_answers_the_same_inline_or_on_the_thread(
    both: tuple[BeneathRootFs, BeneathRootFs], path: str
) -> None:
    inline, threaded = both
    for _ in range(2):
        expected = await _outcome(threaded.exists(path))
        assert await _outcome(inline.exists(path)) == expected


async def test_a_closed_adapter_answers_inline_requests_as_the_thread_does(
    both: tuple[BeneathRootFs, BeneathRootFs],
) -> None:
    inline, threaded = both
    inline.close()
    threaded.close()
    for fs in (inline, threaded):
        assert await _outcome(fs.read_bytes("data/a.bin", max_bytes=4096)) == "SAND_FS_IO_ERROR"


# -- from the attacker's side: any path, any tree -------------------------------------------

_NAMES = ["data", "sub", "a.bin", "empty", "big", "limit", "link", "dirlink", "out", "fifo"]
_COMPONENT = st.sampled_from([*_NAMES, "..", ".", "", "missing", "\0", "a.bin\0", "é"])


@pytest.fixture(scope="module")
def attacked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BeneathRootFs]:
    base = tmp_path_factory.mktemp("attacked")
    root = base / "root"
    (root / "data" / "sub").mkdir(parents=True)
    (root / "data" / "a.bin").write_bytes(b"a" * 1024)
    (root / "data" / "sub" / "a.bin").write_bytes(b"s" * 10)
    (root / "data" / "empty").write_bytes(b"")
    (root / "data" / "big").write_bytes(b"b" * (INLINE_READ_MAX_BYTES + 1))
    (root / "data" / "limit").write_bytes(b"l" * 100)
    (root / "data" / "link").symlink_to("a.bin")
    (root / "data" / "dirlink").symlink_to("sub")
    (root / "data" / "sub" / "up").symlink_to("../..")
    (base / "outside").write_bytes(b"CANARY")
    (root / "data" / "out").symlink_to(base / "outside")
    (root / "data" / "abs").symlink_to("/etc")
    os.mkfifo(root / "data" / "fifo")
    fs = BeneathRootFs(root, max_read_bytes=200_000)
    yield fs
    fs.close()


@settings(max_examples=400, deadline=None)
@given(
    parts=st.one_of(
        st.lists(_COMPONENT, min_size=1, max_size=5),
        st.lists(_COMPONENT, max_size=3).map(lambda rest: ["data", *rest]),  # mostly real
    ),
    limit=st.sampled_from([99, 100, 4096]),
)
def test_an_inline_answer_is_always_the_threads_answer(
    attacked: BeneathRootFs, parts: list[str], limit: int
) -> None:
    # Whatever path a guest's request carries: the inline read either declines (None) or
    # returns exactly what the thread's walk returns, and never anything from outside the root.
    path = "/".join(parts)
    try:
        expected: bytes | str = attacked._read_sync(path, limit)
    except SuaveplanError as exc:
        expected = exc.code
    except ValueError:  # an embedded NUL, refused by the OS layer before any lookup
        expected = "ValueError"
    got = attacked._read_cached(path, limit)
    assert got is None or got == expected
    assert got != b"CANARY"
    # The C twin (when built) answers exactly as the Python reference does.
    assert attacked._read_cached_python(path, limit) == got
    try:
        exists: bool | str = attacked._exists_sync(path)
    except SuaveplanError as exc:
        exists = exc.code
    except ValueError:
        exists = "ValueError"
    found = attacked._exists_cached(path)
    assert found is None or found == exists


_ACROSS_A_MOUNT = """
import json, os, subprocess, sys
from suaveplan_sandbox.adapters._fs import BeneathRootFs
from suaveplan_sandbox.adapters._openat2 import HOW_PATH, HOW_READ
root = sys.argv[1]
inner = os.path.join(root, "data", "inner")
subprocess.run(["mount", "-t", "tmpfs", "none", inner], check=True)
with open(os.path.join(inner, "f"), "wb") as f:
    f.write(b"mounted")
fs = BeneathRootFs(root)
thread = fs._read_sync("data/inner/f", 4096)  # the caches know the path from here on
print(json.dumps({
    "inline_io": fs.inline_io,
    "thread": thread.decode(),
    "open": fs._open_cached("data/inner/f", HOW_READ),
    "open_path": fs._open_cached("data/inner/f", HOW_PATH),
    "read": fs._read_cached("data/inner/f", 4096),
    "exists": fs._exists_cached("data/inner/f"),
    "beside": fs._read_cached("data/a.bin", 4096) is not None,
    # A root that is itself in memory (tmpfs refuses RWF_NOWAIT): read inline, plainly.
    "memory_root": (BeneathRootFs(inner)._read_cached("f", 4096) or b"").decode(),
}))
"""


def test_a_mount_inside_the_root_is_never_crossed_inline(tmp_path: Path) -> None:
    # The root's filesystem type is what made the inline path safe; a mount below the root
    # (an NFS share, say, whose open asks a server) must not be reached by it. Made in a
    # private mount namespace, so nothing outside this test sees it.
    root = tmp_path / "root"
    (root / "data" / "inner").mkdir(parents=True)
    (root / "data" / "a.bin").write_bytes(b"a" * 16)
    unshare = shutil.which("unshare")
    private = unshare is not None and (
        subprocess.run([unshare, "-m", "true"], capture_output=True, check=False).returncode == 0
    )
    if unshare is None or not private:
        # No private mount namespace here (not root, or no util-linux): hold what the kernel
        # would be asked instead, that the inline opens refuse to cross a mount point.
        assert HOW_READ.contents.resolve & RESOLVE_NO_XDEV
        assert HOW_PATH.contents.resolve & RESOLVE_NO_XDEV
        return
    out = subprocess.run(
        [unshare, "-m", sys.executable, "-c", _ACROSS_A_MOUNT, str(root)],
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(out.stdout)
    assert seen["thread"] == "mounted"  # the thread reads it (the walk may cross mounts)
    if seen["inline_io"]:
        # Refused at the mount point: EXDEV, or EAGAIN where the kernel leaves the cached walk
        # to check it (either way the inline path declines).
        assert seen["open"] in (-errno.EXDEV, -errno.EAGAIN)
        assert seen["open_path"] in (-errno.EXDEV, -errno.EAGAIN)
        assert seen["read"] is None and seen["exists"] is None
        assert seen["beside"] is True  # the same adapter still reads its own filesystem inline
        assert seen["memory_root"] == "mounted"


async def test_a_filesystem_refusing_rwf_nowait_stops_being_read_inline(
    both: tuple[BeneathRootFs, BeneathRootFs], monkeypatch: pytest.MonkeyPatch
) -> None:
    inline, _ = both
    inline._read_cached_c = None  # the Python reference; the C twin's refusal is below
    tries: list[int] = []

    def refused(fd: int, buffers: list[bytearray], offset: int, flags: int = 0) -> int:
        tries.append(flags)
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "preadv", refused)
    for _ in range(3):
        assert await inline.read_bytes("data/a.bin", max_bytes=4096) == b"a" * 1024
    # Tried once, then every read went straight to the thread (never tried without inline_io).
    assert len(tries) == (1 if inline.inline_io else 0)
    if inline.inline_io:  # existence checks need no read: still answered inline
        assert await _first_step(inline.exists("data/a.bin")) == (True, True)


# -- the C twin of the inline read (`_speedups.read_cached`) ---------------------------------


def _c_read(inline: BeneathRootFs) -> Any:
    """The C inline read, or None where it is not built (no compiler when installed) or is
    switched off: then the documented fallback holds, the Python reference serves every
    inline read (the tests above). `make test` builds it, so CI runs the C tests."""
    if inline._read_cached_c is None:
        assert speedups_status()["fs_read"] is False
        assert not _speedups_built()
    return inline._read_cached_c


def test_the_c_read_is_the_one_in_use_where_it_is_built(root: Path) -> None:
    fs = BeneathRootFs(root)
    try:
        assert (fs._read_cached_c is not None) is speedups_status()["fs_read"]
        assert (fs._read_cached_c is not None) is _speedups_built()
    finally:
        fs.close()


async def test_the_c_read_passes_a_filesystem_refusal_on_and_reads_stop_being_inline(
    both: tuple[BeneathRootFs, BeneathRootFs],
) -> None:
    inline, _ = both
    if not inline.inline_io:
        return  # never tried inline here: nothing to stop
    read_c = _c_read(inline)
    if read_c is None:
        return
    # preadv2 refuses flags it does not know with EOPNOTSUPP, as a filesystem refuses
    # RWF_NOWAIT: the C read raises it, the adapter stops trying and reads on the thread.
    unknown_flag = 1 << 30
    with pytest.raises(OSError) as info:
        read_c(inline._hold_root(), b"data/a.bin", 4096, unknown_flag, *_OPEN_ARGS)
    inline._release_root()
    assert info.value.errno == errno.EOPNOTSUPP
    inline._read_flags = unknown_flag
    assert await inline.read_bytes("data/a.bin", max_bytes=4096) == b"a" * 1024
    assert inline._read_flags == -1
    assert await _first_step(inline.read_bytes("data/a.bin", max_bytes=4096)) == (False, None)
    assert await inline.read_bytes("data/a.bin", max_bytes=4096) == b"a" * 1024


def test_the_c_read_declines_a_file_the_page_cache_does_not_hold(tmp_path: Path) -> None:
    # Evicting pages is advice the kernel may not take at once (a page still in another
    # CPU's LRU batch is skipped; under load the full suite saw 50 quick tries all fail), so
    # many tries, a moment apart; any one evicted file the C read must decline (None), never
    # block on the disk for it.
    root = tmp_path / "evicted"
    root.mkdir()
    fs = BeneathRootFs(root)
    try:
        if not fs.inline_io or fs._read_flags <= 0:
            # Never inline here, or a memory filesystem (nothing to evict, no RWF_NOWAIT).
            return
        read_c = _c_read(fs)
        if read_c is None:
            return
        data = os.urandom(32 * 1024)
        (root / "f").write_bytes(data)
        fd = os.open(root / "f", os.O_RDONLY)
        try:
            os.fsync(fd)
            answers = []
            for attempt in range(500):
                if attempt:
                    time.sleep(0.002)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                answers.append(
                    read_c(fs._hold_root(), b"f", len(data), fs._read_flags, *_OPEN_ARGS)
                )
                fs._release_root()
                if answers[-1] is None:
                    break
        finally:
            os.close(fd)
        assert None in answers
        assert all(a is None or a == data for a in answers)
        assert fs._read_sync("f", len(data)) == data  # the thread's read, as the adapter falls back
    finally:
        fs.close()


@pytest.mark.parametrize(
    ("path", "limit"),
    [
        (b"data/a.bin\0", 4096),  # a NUL: never a shorter path
        # Paths the kernel would resolve inside the root, but no request may name (what
        # `_normalised` refuses, checked in C before any system call).
        (b"data/../data/a.bin", 4096),
        (b"data/sub/../a.bin", 4096),
        (b"./data/a.bin", 4096),
        (b"data/./a.bin", 4096),
        (b"data//a.bin", 4096),
        (b"data/a.bin/", 4096),
        (b"", 4096),
        (b"data/a.bin", -1),
        (b"/etc/passwd", 4096),  # absolute: refused beneath the root
        (b"data/out", 4096),
        (b"data/fifo", 4096),
        (b"data/sub", 4096),
    ],
)
def test_the_c_read_declines_what_no_inline_read_may_return(
    both: tuple[BeneathRootFs, BeneathRootFs], path: bytes, limit: int
) -> None:
    inline, _ = both
    read_c = _c_read(inline)
    if read_c is None:
        return
    root = inline._hold_root()
    try:
        assert read_c(root, path, limit, 0, *_OPEN_ARGS) is None
        assert read_c(root, b"data/a.bin", 4096, 0, *_OPEN_ARGS) == b"a" * 1024  # the control
        assert read_c(-1, b"data/a.bin", 4096, 0, *_OPEN_ARGS) is None  # no root to resolve in
        with pytest.raises(TypeError):
            read_c(root, "data/a.bin", 4096, 0, *_OPEN_ARGS)  # bytes only
    finally:
        inline._release_root()
