"""`_beneath`: a directory beneath a descriptor, crossing no link, in both of its modes.

Every scenario runs with `openat2` (where this kernel has it) and with the per-component
walk, and both must give the same answer: the mode is an implementation detail, never a
difference in what is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from _descriptors import descriptors_under
from suaveplan_sandbox.adapters import _beneath
from suaveplan_sandbox.adapters._beneath import (
    open_component,
    open_directory,
    open_leaf,
    openat2_available,
    openat2_works,
)

MODES = [
    pytest.param(True, id="openat2"),
    pytest.param(False, id="per-component"),
]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/a/b/c (directories), root/a/b/c/f.txt, root/file, and outside/secret."""
    root = tmp_path / "root"
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "a" / "b" / "c" / "f.txt").write_text("inside")
    (root / "file").write_text("x")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("hunter2")
    return root


@pytest.fixture
def root_fd(tree: Path) -> Iterator[int]:
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    yield fd
    os.close(fd)


def _open(root_fd: int, path: str, use_openat2: bool) -> int:
    if use_openat2 and not openat2_available():
        pytest.fail("this kernel has no openat2: the openat2 mode cannot be tested here")
    return open_directory(root_fd, path.split("/") if path else [], use_openat2=use_openat2)


def _errno(root_fd: int, path: str, use_openat2: bool) -> int:
    with pytest.raises(OSError) as info:
        fd = _open(root_fd, path, use_openat2)
        os.close(fd)
    assert info.value.errno is not None
    return info.value.errno


def _same_dir(fd: int, path: Path) -> bool:
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _open_fds(tree: Path) -> int:
    return descriptors_under(tree.parent)  # the tree and the "outside" beside it


@pytest.mark.parametrize("use_openat2", MODES)
def test_a_plain_directory_is_opened_and_the_start_descriptor_stays_open(
    tree: Path, root_fd: int, use_openat2: bool
) -> None:
    before = _open_fds(tree)
    fd = _open(root_fd, "a/b/c", use_openat2)
    try:
        assert _same_dir(fd, tree / "a" / "b" / "c")
        assert os.fstat(root_fd)  # the caller's descriptor is still the caller's
    finally:
        os.close(fd)
    assert _open_fds(tree) == before  # nothing opened on the way was left behind


@pytest.mark.parametrize("use_openat2", MODES)
def test_no_components_is_a_new_descriptor_of_the_start(
    tree: Path, root_fd: int, use_openat2: bool
) -> None:
    fd = _open(root_fd, "", use_openat2)
    try:
        assert fd != root_fd and _same_dir(fd, tree)
    finally:
        os.close(fd)


@pytest.mark.parametrize("use_openat2", MODES)
@pytest.mark.parametrize("component", ["a", "a/b", "a/b/c"])
def test_a_link_at_any_component_is_refused(
    tree: Path, root_fd: int, use_openat2: bool, component: str
) -> None:
    # Each component in turn replaced by a link to an identical directory *inside* the root:
    # following none is the rule, not "none that leaves".
    real = tree / component
    twin = tree / "twin"
    os.rename(real, twin)
    real.symlink_to(twin if component == "a" else os.path.relpath(twin, real.parent))
    before = _open_fds(tree)
    assert _errno(root_fd, "a/b/c", use_openat2) == errno.ELOOP
    assert _open_fds(tree) == before


@pytest.mark.parametrize("use_openat2", MODES)
def test_an_absolute_link_out_of_the_root_is_refused(
    tree: Path, root_fd: int, use_openat2: bool
) -> None:
    (tree / "out").symlink_to(tree.parent / "outside")
    assert _errno(root_fd, "out", use_openat2) == errno.ELOOP
    (tree / "a" / "abs").symlink_to("/")
    assert _errno(root_fd, "a/abs/etc", use_openat2) == errno.ELOOP


@pytest.mark.parametrize("use_openat2", MODES)
def test_a_dangling_link_is_a_link_not_a_missing_entry(
    tree: Path, root_fd: int, use_openat2: bool
) -> None:
    (tree / "a" / "gone").symlink_to(tree / "nowhere")
    assert _errno(root_fd, "a/gone", use_openat2) == errno.ELOOP


@pytest.mark.parametrize("use_openat2", MODES)
@pytest.mark.parametrize(
    "parts",
    [
        ["a", ".."],
        ["..", "outside"],
        ["a", "..", "..", "outside"],
        ["."],
        ["a", ""],
        ["a/b"],
        ["a\0"],
    ],
)
def test_dot_dot_dot_empty_slash_and_nul_components_are_refused_before_any_system_call(
    root_fd: int, use_openat2: bool, parts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if use_openat2 and not openat2_available():
        pytest.fail("this kernel has no openat2")

    def no_syscall(*args: object, **kwargs: object) -> int:
        raise AssertionError("a system call was made")

    monkeypatch.setattr(_beneath, "openat2", no_syscall)
    monkeypatch.setattr(_beneath, "open_component", no_syscall)
    with pytest.raises(OSError) as info:
        open_directory(root_fd, parts, use_openat2=use_openat2)
    assert info.value.errno == errno.EINVAL


@pytest.mark.parametrize("use_openat2", MODES)
def test_a_missing_component_is_enoent(tree: Path, root_fd: int, use_openat2: bool) -> None:
    assert _errno(root_fd, "a/nope/c", use_openat2) == errno.ENOENT


@pytest.mark.parametrize("use_openat2", MODES)
def test_a_file_where_a_directory_is_expected_is_enotdir(
    tree: Path, root_fd: int, use_openat2: bool
) -> None:
    assert _errno(root_fd, "file", use_openat2) == errno.ENOTDIR
    assert _errno(root_fd, "file/x", use_openat2) == errno.ENOTDIR


@pytest.mark.timeout(30)
@pytest.mark.parametrize("use_openat2", MODES)
def test_a_fifo_is_refused_without_blocking_on_it(
    tree: Path, root_fd: int, use_openat2: bool
) -> None:
    os.mkfifo(tree / "a" / "fifo")  # nobody ever opens the other end
    assert _errno(root_fd, "a/fifo", use_openat2) == errno.ENOTDIR
    assert _errno(root_fd, "a/fifo/x", use_openat2) == errno.ENOTDIR


@pytest.mark.timeout(30)
@pytest.mark.parametrize("use_openat2", MODES)
def test_a_device_is_refused_without_opening_it(
    tree: Path, root_fd: int, use_openat2: bool
) -> None:
    # /dev/null stands for any device: reached from its own directory, opened as a directory.
    dev = os.open("/dev", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        assert stat.S_ISCHR(os.stat("null", dir_fd=dev).st_mode)
        assert _errno(dev, "null", use_openat2) == errno.ENOTDIR
    finally:
        os.close(dev)


@contextlib.contextmanager
def _deep_tree(
    top: int, depth: int, *, name: str = "d", loop_to: str | None = None
) -> Iterator[list[str]]:
    """`name/name/.../name` (`depth` of them) beneath `top`, built and removed by descriptor:
    the path may be past what path-based tools (and pytest's recursive cleanup) take."""
    parts = [name] * depth
    fd = os.dup(top)
    made = 0
    try:
        for part in parts:
            os.mkdir(part, dir_fd=fd)
            made += 1
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        if loop_to is not None:
            os.symlink(loop_to, "loop", dir_fd=fd)
        yield parts
    finally:
        # Bottom up through `..`: one open per level, whatever the depth.
        with contextlib.suppress(FileNotFoundError):
            os.unlink("loop", dir_fd=fd)
        for _ in range(made):
            parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(name, dir_fd=fd)
        os.close(fd)


@pytest.mark.parametrize("use_openat2", MODES)
def test_a_deep_tree_is_walked_and_a_link_at_its_bottom_still_refused(
    tmp_path: Path, use_openat2: bool
) -> None:
    # 200 components: far deeper than the kernel's limit on links followed in one lookup
    # (40), which must play no part in a walk that follows none.
    top = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with _deep_tree(top, 200, loop_to=str(tmp_path)) as parts:
            os.close(_open(top, "/".join(parts), use_openat2))
            assert _errno(top, "/".join([*parts, "loop"]), use_openat2) == errno.ELOOP
    finally:
        os.close(top)


@pytest.mark.parametrize("use_openat2", MODES)
def test_a_path_too_long_for_one_call_is_refused_by_openat2_and_walked_otherwise(
    tmp_path: Path, use_openat2: bool
) -> None:
    # 20 components of 250 bytes: 5,019 bytes, past PATH_MAX. openat2 takes the path in one
    # string and refuses it (ENAMETOOLONG, never a partial resolution); the walk takes one
    # name at a time. `BeneathRootFs` never asks for such a path (the checker caps a path
    # at 4,096 bytes); the WASM preopens never either (a host path that long fails the
    # vetting `stat` first).
    top = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with _deep_tree(top, 20, name="d" * 250) as parts:
            if use_openat2:
                assert _errno(top, "/".join(parts), use_openat2) == errno.ENAMETOOLONG
            else:
                os.close(_open(top, "/".join(parts), use_openat2))
    finally:
        os.close(top)


def test_a_directory_swapped_for_a_link_between_two_steps_is_refused(
    tree: Path, root_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The walk has opened `a` and is about to open `b` from it when `b` becomes a link to
    # the outside: the step that reaches `b` refuses it (it is itself a no-follow open), so
    # the swap lands between two checks and still buys nothing.
    real = _beneath.open_component
    swapped: list[str] = []

    def racing(
        dir_fd: int | None, name: str | os.PathLike[str], flags: int = _beneath.DIR_FLAGS
    ) -> int:
        if name == "b" and not swapped:
            os.rename(tree / "a" / "b", tree / "b-moved")
            (tree / "a" / "b").symlink_to(tree.parent / "outside")
            swapped.append("b")
        return real(dir_fd, name, flags)

    monkeypatch.setattr(_beneath, "open_component", racing)
    before = _open_fds(tree)
    with pytest.raises(OSError) as info:
        open_directory(root_fd, ["a", "b"], use_openat2=False)
    assert info.value.errno == errno.ELOOP
    assert swapped == ["b"]
    assert _open_fds(tree) == before


def test_a_held_descriptor_keeps_the_directory_it_vetted_after_a_swap(
    tree: Path, root_fd: int
) -> None:
    # What a caller gets is the directory itself: a later swap of its path for a link to the
    # outside changes nothing seen through the descriptor (the WASM preopens rely on this).
    fd = open_directory(root_fd, ["a", "b", "c"], use_openat2=openat2_available())
    try:
        os.rename(tree / "a", tree / "a-moved")
        (tree / "a").symlink_to(tree.parent / "outside")
        assert sorted(os.listdir(fd)) == ["f.txt"]
    finally:
        os.close(fd)


def test_open_component_checks_the_last_component_of_a_host_path(tmp_path: Path) -> None:
    # The migrations folder's path is the host's (its ancestors may be links the host made);
    # only the folder itself must not be one.
    real = tmp_path / "real"
    (real / "migrations").mkdir(parents=True)
    via_link = tmp_path / "host-link"
    via_link.symlink_to(real)
    os.close(open_component(None, via_link / "migrations"))
    (real / "linked").symlink_to(real / "migrations")
    with pytest.raises(OSError) as info:
        open_component(None, via_link / "linked")
    assert info.value.errno == errno.ELOOP
    (real / "plain").write_text("x")
    with pytest.raises(OSError) as info:
        open_component(None, real / "plain")
    assert info.value.errno == errno.ENOTDIR


@pytest.mark.parametrize("use_openat2", MODES)
def test_a_leaf_that_is_a_link_is_refused_and_a_file_opens(
    tree: Path, root_fd: int, use_openat2: bool
) -> None:
    if use_openat2 and not openat2_available():
        pytest.fail("this kernel has no openat2")
    dfd = open_directory(root_fd, ["a", "b", "c"], use_openat2=use_openat2)
    try:
        fd = open_leaf(dfd, "f.txt", os.O_RDONLY, use_openat2=use_openat2)
        try:
            assert os.read(fd, 16) == b"inside"
        finally:
            os.close(fd)
        os.symlink(str(tree.parent / "outside" / "secret"), "link", dir_fd=dfd)
        with pytest.raises(OSError) as info:
            open_leaf(dfd, "link", os.O_RDONLY, use_openat2=use_openat2)
        assert info.value.errno == errno.ELOOP
    finally:
        os.close(dfd)


def test_the_openat2_probe_answers_for_this_kernel(root_fd: int) -> None:
    # The probe is a real call: it agrees with whether a real call works.
    works = openat2_works(root_fd)
    assert works == openat2_available()
    if works:
        os.close(_beneath.openat2(root_fd, ".", _beneath.DIR_FLAGS))
