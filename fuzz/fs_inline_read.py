"""Fuzz target: the fs adapter's inline read in C (`_speedups.read_cached`) against its Python
reference, on a tree built to be escaped from.

Input layout: byte 0 picks the read limit; the rest, decoded as the fs adapter decodes names
(UTF-8 with surrogateescape), is the path. Properties checked for every input:

* `BeneathRootFs._read_cached` (the C twin) and `_read_cached_python` return the same: both
  None, or the same bytes;
* whatever either returns is what the thread's walk (`_read_sync`) returns for that path,
  and never the canary outside the root;
* the raw C call, handed the path's bytes without the adapter's own path checks (`..`, `.`,
  empty components, absolute paths, a NUL), returns None or the bytes of a file inside the
  root: the kernel's `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` flags it passes are what hold.

Coverage comes from the instrumented Python side; `make asan` runs the C under
AddressSanitizer through `tests/adapters/test_fs_inline.py`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["suaveplan_sandbox"]):
    from suaveplan_sandbox.adapters._fs import INLINE_READ_MAX_BYTES, BeneathRootFs
    from suaveplan_sandbox.adapters._openat2 import CACHED_RESOLVE, PATH_FLAGS, READ_FLAGS
    from suaveplan_sandbox.errors import SuaveplanError

from fuzz._target import Finding, run_target

CANARY = b"CANARY-outside-the-root"
LIMITS = (0, 1, 9, 10, 11, 99, 100, 4096, INLINE_READ_MAX_BYTES, INLINE_READ_MAX_BYTES + 1)
FILES = {
    "data/a.bin": b"a" * 1024,
    "data/sub/s.txt": b"s" * 10,
    "data/empty": b"",
    "data/limit": b"l" * 100,
    "data/big": b"b" * (INLINE_READ_MAX_BYTES + 1),
    "top.txt": b"top",
}


def _tree() -> Path:
    base = Path(tempfile.mkdtemp(prefix="fuzz-fs-inline-"))
    atexit.register(shutil.rmtree, base, True)
    root = base / "root"
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (base / "outside").write_bytes(CANARY)
    links = {
        "data/link": "a.bin",
        "data/dirlink": "sub",
        "data/sub/up": "../..",
        "data/out": str(base / "outside"),
        "data/abs": "/etc",
        "data/loop": "loop",
    }
    for name, target in links.items():
        (root / name).symlink_to(target)
    os.mkfifo(root / "data" / "fifo")
    return root


ROOT = _tree()
FS = BeneathRootFs(ROOT, max_read_bytes=1 << 20)
READ_C = FS._read_cached_c
INSIDE = set(FILES.values())


def _thread(path: str, limit: int) -> object:
    try:
        return FS._read_sync(path, limit)
    except SuaveplanError as exc:
        return exc.code
    except ValueError:  # a NUL, refused before any lookup
        return "ValueError"


def test_one_input(data: bytes) -> None:
    limit = LIMITS[data[0] % len(LIMITS)] if data else 4096
    raw = data[1:]
    path = raw.decode("utf-8", "surrogateescape")
    got = FS._read_cached(path, limit)
    want = FS._read_cached_python(path, limit)
    if got != want:
        raise Finding(f"{path!r} limit {limit}: C {got!r:.80}, Python {want!r:.80}")
    if got is not None and got != _thread(path, limit):
        raise Finding(f"{path!r} limit {limit}: inline {got!r:.80} is not the thread's answer")
    if READ_C is None or not FS.inline_io:
        return  # no C twin in use here: the comparison above was Python against itself
    root = FS._hold_root()
    try:
        direct = READ_C(root, raw, limit, FS._read_flags, PATH_FLAGS, READ_FLAGS, CACHED_RESOLVE)
    finally:
        FS._release_root()
    if direct is not None and (direct not in INSIDE or len(direct) > limit):
        raise Finding(f"{raw!r} limit {limit}: the raw C read returned {direct!r:.80}")


def seeds() -> Iterator[bytes]:
    names = [*FILES, "data/link", "data/dirlink/s.txt", "data/sub/up/top.txt", "data/out"]
    names += ["data/abs/passwd", "data/fifo", "data/loop", "../outside", "/etc/passwd"]
    names += ["data/../top.txt", "./top.txt", "data//a.bin", "data/a.bin\0", "data", ""]
    for name in names:
        for limit in (5, 7, 8):  # 99, 4096 and the inline maximum: under, at and over sizes
            yield bytes([limit]) + name.encode("utf-8", "surrogateescape")


if __name__ == "__main__":
    run_target(test_one_input, seeds)
    sys.exit(0)
