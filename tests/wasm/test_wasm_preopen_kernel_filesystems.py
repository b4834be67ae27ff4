"""A WASI preopen on, or holding a mount of, a kernel filesystem is refused at create.

wasmtime (cap-std) resolves a guest's paths beneath the preopen descriptor it is handed, and
crosses mount points on the way: with procfs mounted beneath a preopened directory (a
container rootfs as the root, or a root of "/"), `proc/<pid>/environ` handed the guest the
host's environment. The fs adapter refuses kernel filesystems per request; a preopen cannot
be vetted per request, so creation fails instead (`SAND_WASM_PREOPEN_DENIED`,
`details.reason` `kernel-filesystem`), and fails closed when the mount table cannot be read
(`mounts-unreadable`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from suaveplan_sandbox.adapters._openat2 import KERNEL_FILESYSTEM_TYPES, KERNEL_FILESYSTEMS
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import _mounts, create_wasm_sandbox

FSPROBE = Path(__file__).parent / "fixtures" / "fsprobe.wasm"


def _policy(root: Path, *rules: str) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"fs": list(rules)}}, root=root
    )


async def _refusal(root: Path, rule: str) -> SuaveplanError:
    metrics = InMemoryMetrics()
    with pytest.raises(SuaveplanError) as info:
        await create_wasm_sandbox(
            wasm_module_path=FSPROBE, policy=_policy(root, rule), metrics=metrics
        )
    # The host's mounts, not a request the plugin made: no denial is counted.
    assert metrics.value("plugin.permission_denied_total") == 0
    return info.value


# -- the host's own procfs and sysfs, beneath a root of "/" ------------------------------------


async def _the_hosts_kernel_filesystems_are_refused_beneath_slash() -> None:
    # "./*" preopens "/" (procfs and sysfs are mounted beneath it); "proc/*" and "sys/*"
    # preopen directories that are themselves on procfs and sysfs.
    for rule, guest in (("./*", "/"), ("proc/*", "/proc"), ("sys/*", "/sys")):
        exc = await _refusal(Path("/"), rule)
        assert exc.code == "SAND_WASM_PREOPEN_DENIED", rule
        assert exc.details["reason"] == "kernel-filesystem", rule
        assert exc.details["guest_path"] == guest, rule
        assert exc.details["filesystem"] in KERNEL_FILESYSTEM_TYPES, rule


async def test_a_root_of_slash_preopening_proc_and_sys_is_refused() -> None:
    await _the_hosts_kernel_filesystems_are_refused_beneath_slash()


async def test_an_honest_preopen_is_unaffected(root: Path) -> None:
    async with await create_wasm_sandbox(
        wasm_module_path=FSPROBE, policy=_policy(root, "./uploads/*")
    ) as sb:
        for _ in range(2):  # each run is given the held descriptor again
            res = await sb.run(argv=["fsprobe", "read", "/uploads/a.txt"])
            assert (res.exit_code, res.stdout) == (0, b"ok hello\n")


async def test_an_unreadable_mount_table_fails_closed(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_mounts, "MOUNTINFO", tmp_path / "no-such-mountinfo")
    exc = await _refusal(root, "./uploads/*")
    assert exc.code == "SAND_WASM_PREOPEN_DENIED"
    assert exc.details == {"capability": "fs", "reason": "mounts-unreadable"}


async def test_a_malformed_mount_table_fails_closed(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    garbled = tmp_path / "mountinfo"
    garbled.write_bytes(b"22 1 0:21 / /proc rw,nosuid shared:12 proc proc rw\n")  # no " - "
    monkeypatch.setattr(_mounts, "MOUNTINFO", garbled)
    exc = await _refusal(root, "./uploads/*")
    assert exc.details == {"capability": "fs", "reason": "mounts-unreadable"}


async def test_no_preopens_read_no_mount_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_mounts, "MOUNTINFO", tmp_path / "no-such-mountinfo")
    async with await create_wasm_sandbox(wasm_module_path=FSPROBE, policy=_policy(tmp_path)):
        pass


def test_the_mount_table_is_read_once_per_create(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Path] = []
    real = _mounts.read_mountinfo

    def counting() -> bytes | None:
        reads.append(_mounts.MOUNTINFO)
        return real()

    monkeypatch.setattr(_mounts, "read_mountinfo", counting)
    (root / "more").mkdir()

    async def create_and_run() -> None:
        async with await create_wasm_sandbox(
            wasm_module_path=FSPROBE,
            policy=_policy(root, "./uploads/*", "./private/*", "./more/*"),
        ) as sb:
            await sb.run(argv=["fsprobe", "read", "/uploads/a.txt"])
            await sb.run(argv=["fsprobe", "read", "/uploads/a.txt"])

    asyncio.run(create_and_run())
    assert len(reads) == 1


# -- a private mount namespace: procfs, sysfs and a bind-mounted procfs file under a tmp root --

_NAMESPACE = r"""
import asyncio, json, os, subprocess, sys
from pathlib import Path
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import create_wasm_sandbox

root, probe = Path(sys.argv[1]), sys.argv[2]
os.environ["SUAVEPLAN_PROBE_SECRET"] = "hunter2"
subprocess.run(["mount", "-t", "proc", "proc", str(root / "database")], check=True)
subprocess.run(["mount", "-t", "sysfs", "sysfs", str(root / "nest" / "deep" / "sys")], check=True)
pid = os.getpid()
subprocess.run(["mount", "--bind", f"/proc/{pid}/environ", str(root / "files" / "env")], check=True)

async def create(rule, argv):
    policy = PermissionPolicy.from_manifest(
        {"name": "guest", "permissions": {"fs": [rule]}}, root=root
    )
    try:
        async with await create_wasm_sandbox(wasm_module_path=probe, policy=policy) as sb:
            res = await sb.run(argv=argv)
            return [res.exit_code, res.stdout.decode(errors="replace")]
    except SuaveplanError as exc:
        return [exc.code, exc.details.get("reason"), exc.details.get("filesystem")]

async def main():
    out = {
        "database": await create("./database/*", ["p", "read", f"/database/{pid}/environ"]),
        "nest": await create("./nest/*", ["p", "read", "/nest/deep/sys/kernel/uevent_seqnum"]),
        "files": await create("./files/*", ["p", "read", "/files/env"]),
        "root": await create("./*", ["p", "read", f"/database/{pid}/environ"]),
        "data": await create("./data/*", ["p", "read", "/data/a.txt"]),
    }
    print(json.dumps(out))

asyncio.run(main())
"""


def _unshare() -> str | None:
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    probe = subprocess.run([unshare, "-m", "true"], capture_output=True, check=False)
    return unshare if probe.returncode == 0 else None


def test_kernel_filesystems_mounted_beneath_a_preopen_are_refused(tmp_path: Path) -> None:
    # A space in the root's name: mountinfo writes it `\040`, which must be unescaped for
    # the mounts beneath it to be seen at all.
    root = tmp_path / "rootfs dir"
    for sub in ("database", "nest/deep/sys", "files", "data"):
        (root / sub).mkdir(parents=True)
    (root / "files" / "env").write_bytes(b"")  # the bind mount's mount point
    (root / "data" / "a.txt").write_text("fine")
    unshare = _unshare()
    if unshare is None:
        # No private mount namespace here (it needs root and util-linux `unshare`): the
        # host's own procfs and sysfs, beneath a root of "/", are checked instead.
        asyncio.run(_the_hosts_kernel_filesystems_are_refused_beneath_slash())
        return
    done = subprocess.run(
        [unshare, "-m", sys.executable, "-c", _NAMESPACE, str(root), str(FSPROBE)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "hunter2" not in done.stdout
    seen = json.loads(done.stdout)
    denied = "SAND_WASM_PREOPEN_DENIED"
    # The preopen itself on procfs (fstatfs), sysfs two levels beneath one, a procfs file
    # bind-mounted into one, and the root holding all of them (mountinfo).
    assert seen["database"] == [denied, "kernel-filesystem", "proc"]
    assert seen["nest"] == [denied, "kernel-filesystem", "sysfs"]
    assert seen["files"] == [denied, "kernel-filesystem", "proc"]
    assert seen["root"][:2] == [denied, "kernel-filesystem"]
    # `data` only shares a prefix with `database`: not beneath it, so unaffected.
    assert seen["data"] == [0, "ok fine\n"]


# -- the mountinfo parser ----------------------------------------------------------------------

_MOUNTINFO = (
    b"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    b"23 22 0:21 / /proc rw,nosuid shared:12 - proc proc rw\n"
    b"24 22 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n"
    b"25 24 0:23 / /sys/fs/cgroup rw master:3 - cgroup2 cgroup2 rw\n"
    b"26 22 0:24 / /my\\040root/in\\011tab/p rw - proc proc rw\n"
    b"27 22 0:25 / /back\\134slash rw - devpts devpts rw\n"
    b"28 22 0:26 / /data/x rw - tmpfs tmpfs rw\n"
    b"29 22 0:21 /1/environ /database rw - proc proc rw\n"
    b"30 22 0:27 / /tmp/with\\040-\\040dash rw - mqueue mqueue rw\n"
)


def test_the_parser_keeps_kernel_mounts_and_unescapes_octal() -> None:
    assert _mounts.kernel_mounts(_MOUNTINFO) == [
        ("/proc", "proc"),
        ("/sys", "sysfs"),
        ("/sys/fs/cgroup", "cgroup2"),
        ("/my root/in\ttab/p", "proc"),
        ("/back\\slash", "devpts"),
        ("/database", "proc"),
        ("/tmp/with - dash", "mqueue"),  # a " - " inside an escaped mount point
    ]


def test_a_non_utf8_mount_point_round_trips_through_fsdecode() -> None:
    line = b"26 22 0:24 / /caf\xe9/p rw - proc proc rw\n"
    ((point, _),) = _mounts.kernel_mounts(line)
    assert point.encode("utf-8", "surrogateescape") == b"/caf\xe9/p"


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("/", "proc"),  # "/" holds every mount
        ("/proc", "proc"),  # the mount point is the preopen itself
        ("/sys", "sysfs"),
        ("/sys/fs", "cgroup2"),
        ("/my root", "proc"),
        ("/my root/in\ttab", "proc"),
        ("/data", None),  # /database only shares a prefix with /data
        ("/dat", None),
        ("/data/x", None),  # tmpfs is not a kernel filesystem
        ("/my", None),
        ("/home/user", None),
        ("/proc2", None),
        ("/back", None),
    ],
)
def test_a_kernel_mount_at_or_beneath_a_path_compares_components(
    host: str, expected: str | None
) -> None:
    found = _mounts.kernel_mount_beneath(PurePosixPath(host), _mounts.kernel_mounts(_MOUNTINFO))
    assert (found[1] if found is not None else None) == expected


@pytest.mark.parametrize(
    "line",
    [
        b"23 22 0:21 / /proc rw shared:12 proc proc rw\n",  # no separator
        b"23 22 0:21 / /proc rw -\n",  # no filesystem type after it
        b"23 22 0:21\n",  # too few fields
        b"23 22 0:21 / proc rw - proc proc rw\n",  # a mount point that is not absolute
    ],
)
def test_a_malformed_line_is_refused(line: bytes) -> None:
    with pytest.raises(ValueError):
        _mounts.kernel_mounts(line)


def test_an_unreadable_mount_table_reads_as_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_mounts, "MOUNTINFO", tmp_path / "missing")
    assert _mounts.read_mountinfo() is None
    unreadable = tmp_path / "dir"
    unreadable.mkdir()
    monkeypatch.setattr(_mounts, "MOUNTINFO", unreadable)  # EISDIR
    assert _mounts.read_mountinfo() is None


def test_the_names_are_the_magic_numbers() -> None:
    assert frozenset(KERNEL_FILESYSTEM_TYPES.values()) == KERNEL_FILESYSTEMS
    assert len(KERNEL_FILESYSTEM_TYPES) == len(KERNEL_FILESYSTEMS) == 18
    assert {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue"} <= set(
        KERNEL_FILESYSTEM_TYPES
    )
