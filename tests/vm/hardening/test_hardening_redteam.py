"""Red-team probes: what native code inside a hardened worker must still not reach.

Landlock governs opening files, not their metadata (mode, owner, times, xattrs); SysV IPC,
rlimits and scheduling of other processes of the same uid, and a root worker's capabilities
are outside both Landlock and a filter that only refuses processes and sockets.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import mmap
import os
import resource
import signal
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from _forking import fork
from suaveplan_sandbox.vm._hardening import RlimitSettings, apply_hardening, prepare_hardening
from suaveplan_sandbox.vm._hardening import _apply as A
from suaveplan_sandbox.vm._hardening._apply import build_seccomp_program, pid_slot_offsets

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.uname().machine != "x86_64",
    reason="the seccomp filter and Landlock are x86_64 Linux only",
)

_LIMITS = RlimitSettings(address_space_bytes=None, cpu_seconds=30)
_EPERM_OR_EACCES = (errno.EPERM, errno.EACCES)


def _in_hardened_child(body: Callable[[], dict[str, object]]) -> dict[str, object]:
    """Run `body` after every layer is applied; its JSON answer (or the signal that ended it)."""
    plan = prepare_hardening(_LIMITS)
    r, w = os.pipe()
    pid = fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(r)
            apply_hardening(plan, keep_fds=[w], require=("seccomp", "no_new_privs"))
            os.write(w, json.dumps(body()).encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    out = json.loads(b"".join(chunks))  # plain data from our own test child
    assert isinstance(out, dict)
    return out


def _errno_of(fn: Callable[[], object]) -> int | str:
    try:
        fn()
    except OSError as exc:
        return exc.errno or -1
    return "ok"


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _sys(nr: int, *args: int) -> int | str:
    """A raw syscall's errno, or "ok"."""
    libc = _libc()
    rc = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    return ctypes.get_errno() if rc == -1 else "ok"


# -- file metadata: Landlock has no hook for chmod/chown/utimes/xattrs -------------------


def test_host_files_metadata_cannot_be_changed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"secret")
    victim.chmod(0o600)
    os.utime(victim, (1000, 1000))
    before = victim.stat()
    path = str(victim)
    uid, gid = os.getuid(), os.getgid()

    def body() -> dict[str, object]:
        return {
            "chmod": _errno_of(lambda: os.chmod(path, 0o666)),
            "chown": _errno_of(lambda: os.chown(path, uid, gid)),
            "lchown": _errno_of(lambda: os.lchown(path, uid, gid)),
            "utime": _errno_of(lambda: os.utime(path, (1, 1))),
            "setxattr": _errno_of(lambda: os.setxattr(path, "user.suave", b"1")),
            "removexattr": _errno_of(lambda: os.removexattr(path, "user.suave")),
            "listxattr": _errno_of(lambda: os.listxattr(path)),
            "fchmodat2": _sys(452, -100, 0, 0o666, 0),
            "setxattrat": _sys(463, -100, 0, 0, 0, 0, 0),
            "file_setattr": _sys(469, -100, 0, 0, 0, 0),
        }

    out = _in_hardened_child(body)
    for name in ("chmod", "chown", "lchown", "utime", "setxattr", "removexattr", "listxattr"):
        assert out[name] == errno.EPERM, (name, out)
    for name in ("fchmodat2", "setxattrat", "file_setattr"):
        assert out[name] in (errno.EPERM, errno.ENOSYS), (name, out)
    after = victim.stat()
    assert (after.st_mode, after.st_uid, after.st_mtime) == (
        before.st_mode,
        before.st_uid,
        before.st_mtime,
    )


# -- SysV IPC and POSIX message queues: shared with the host and every sibling ----------

_IPC_CREAT = 0o1000
_IPC_RMID = 0


def test_sysv_ipc_and_message_queues_are_denied() -> None:
    libc = _libc()
    libc.shmat.restype = ctypes.c_void_p
    key = 0x5AFE0000 | (os.getpid() & 0xFFFF)
    shmid = libc.shmget(key, 4096, _IPC_CREAT | 0o600)
    if shmid < 0:
        pytest.skip("no SysV shared memory here")
    try:

        def body() -> dict[str, object]:
            child = _libc()
            child.shmat.restype = ctypes.c_void_p
            found = child.shmget(key, 0, 0)
            attached = "no-id"
            if found >= 0:
                addr = child.shmat(found, None, 0)
                if addr in (None, ctypes.c_void_p(-1).value):
                    attached = str(ctypes.get_errno())
                else:
                    ctypes.memmove(addr, b"from-worker", 11)
                    attached = "wrote"
            return {
                "shmget": ctypes.get_errno() if found < 0 else "ok",
                "attached": attached,
                # No IPC_CREAT and a key nobody uses: ENOENT when reached, never a new object.
                "msgget": _sys(68, key ^ 0xFFFF, 0),
                "semget": _sys(64, key ^ 0xFFFF, 1, 0),
                "mq_open": _sys(240, 0, 0, 0, 0),
                "mq_unlink": _sys(241, 0),
            }

        out = _in_hardened_child(body)
        addr = libc.shmat(shmid, None, 0)
        seen = ctypes.string_at(addr, 11)
        libc.shmdt(ctypes.c_void_p(addr))
    finally:
        libc.shmctl(shmid, _IPC_RMID, None)
    assert seen == b"\0" * 11
    assert out["shmget"] == errno.EPERM, out
    for name in ("msgget", "semget", "mq_open", "mq_unlink"):
        assert out[name] == errno.EPERM, (name, out)


# -- other processes of the same uid: rlimits, priority, affinity, scheduling -----------


def test_other_processes_rlimits_and_scheduling_cannot_be_changed() -> None:
    # Every probe asks for what the parent already has (or is invalid), so a probe that gets
    # through changes nothing: a worker could otherwise set the host's RLIMIT_CPU to 1 or
    # renice every process of its uid.
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    affinity = os.sched_getaffinity(0)

    def body() -> dict[str, object]:
        parent = os.getppid()
        return {
            "prlimit_parent_read": _errno_of(
                lambda: resource.prlimit(parent, resource.RLIMIT_NOFILE)
            ),
            "prlimit_parent_write": _errno_of(
                lambda: resource.prlimit(parent, resource.RLIMIT_NOFILE, nofile)
            ),
            "setrlimit_own_lower": _errno_of(
                lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
            ),
            "setpriority_parent": _errno_of(lambda: os.setpriority(os.PRIO_PROCESS, parent, nice)),
            "setaffinity_parent": _errno_of(lambda: os.sched_setaffinity(parent, affinity)),
            "setaffinity_own": _errno_of(lambda: os.sched_setaffinity(0, affinity)),
            "sched_setscheduler_own": _errno_of(
                lambda: os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            ),
            "ioprio_set_bad_class": _sys(251, 1, parent, 0xFFFF),  # EINVAL when reached
            "migrate_pages": _sys(256, parent, 0, 0, 0),
            "process_madvise": _sys(440, -1, 0, 0, 0, 0),
        }

    out = _in_hardened_child(body)
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == nofile
    assert os.getpriority(os.PRIO_PROCESS, 0) == nice
    assert os.sched_getaffinity(0) == affinity
    for name, value in out.items():
        if name in ("setrlimit_own_lower", "setaffinity_own"):
            assert value == "ok", (name, out)  # its own limits still move (the CPU backstop)
        else:
            assert value == errno.EPERM, (name, out)


# -- a root worker keeps no capabilities -------------------------------------------------


def _capabilities() -> tuple[int, int, int]:
    libc = _libc()
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    return (
        data[0] | data[3] << 32,  # effective
        data[1] | data[4] << 32,  # permitted
        data[2] | data[5] << 32,  # inheritable
    )


def test_worker_holds_no_capabilities_even_as_root() -> None:
    def body() -> dict[str, object]:
        # Each probe is refused or invalid, never effective: sethostname checks
        # CAP_SYS_ADMIN before the length (65 > __NEW_UTS_LEN: EINVAL for a capable caller);
        # settimeofday(NULL, NULL) sets nothing.
        return {
            "caps": list(_capabilities()),
            "sethostname": _sys(170, 0, 65),
            "syslog": _sys(103, 10, 0, 0),  # SYSLOG_ACTION_SIZE_BUFFER
            "fanotify_init": _sys(300, 0, 0),
            "inotify_init1": _sys(294, 0),
            "settimeofday": _sys(164, 0, 0),
        }

    out = _in_hardened_child(body)
    assert out["caps"] == [0, 0, 0], out
    for key in ("sethostname", "syslog", "fanotify_init", "inotify_init1", "settimeofday"):
        assert out[key] in _EPERM_OR_EACCES, (key, out)


# -- clone: threads yes, namespaces no ------------------------------------------------

_CLONE_THREAD_FLAGS = 0x100 | 0x800 | 0x10000  # CLONE_VM | CLONE_SIGHAND | CLONE_THREAD


def test_threads_cannot_be_cloned_into_new_namespaces() -> None:
    def body() -> dict[str, object]:
        libc = _libc()
        libc.clone.restype = ctypes.c_int
        stack = ctypes.create_string_buffer(1 << 16)
        top = ctypes.c_void_p(ctypes.addressof(stack) + (1 << 16) - 64)
        # The thread runs getpid and exits: no Python runs on it.
        fn = ctypes.cast(libc.getpid, ctypes.c_void_p)
        out: dict[str, object] = {}
        for ns_name, flag in (("uts", 0x04000000), ("net", 0x40000000), ("mnt", 0x20000)):
            rc = libc.clone(fn, top, _CLONE_THREAD_FLAGS | flag, None)
            out[ns_name] = ctypes.get_errno() if rc == -1 else "created"
            if rc != -1:
                threading.Event().wait(0.05)  # let it exit before the stack is reused
        ran: list[int] = []
        t = threading.Thread(target=lambda: ran.append(1))
        t.start()
        t.join()
        out["thread"] = ran
        return out

    out = _in_hardened_child(body)
    assert out["thread"] == [1]
    for ns_name in ("uts", "net", "mnt"):
        assert out[ns_name] == errno.EPERM, (ns_name, out)


# -- foreign ABIs ----------------------------------------------------------------------


def test_i386_int80_syscall_kills_the_worker() -> None:
    def body() -> dict[str, object]:
        code = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        code.write(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")  # mov eax, 20 (i386 getpid); int 0x80
        entry = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(code)))
        return {"survived": entry()}

    out = _in_hardened_child(body)
    # SIGSYS from the filter; SIGSEGV where the kernel has no i386 emulation at all.
    assert out.get("signal") in (31, 11), out


# -- things the filter already refused: kept as regressions ------------------------------

_REFUSED = {
    "io_uring_setup": (425, 8, 0),
    "io_uring_enter": (426, 0, 0),
    "io_uring_register": (427, 0, 0),
    "userfaultfd": (323, 0),
    "execveat": (322, -1, 0, 0, 0, 0x1000),
    "pidfd_getfd": (438, 0, 0, 0),
    "process_vm_readv": (310, 1, 0, 0, 0, 0, 0),
    "process_vm_writev": (311, 1, 0, 0, 0, 0, 0),
    "ptrace": (101, 16, 1, 0, 0),
    "kcmp": (312, 1, 1, 0, 0, 0),
    "perf_event_open": (298, 0, 0, -1, -1, 0),
    "bpf": (321, 0, 0, 0),
    "keyctl": (250, 0, 0),
    "add_key": (248, 0, 0, 0, 0, 0),
    "request_key": (249, 0, 0, 0, 0),
    "unshare": (272, 0x10000000),
    "setns": (308, 0, 0),
    "mount": (165, 0, 0, 0, 0, 0),
    "umount2": (166, 0, 0),
    "fsopen": (430, 0, 0),
    "fsmount": (432, 0, 0, 0),
    "open_tree": (428, -100, 0, 1),
    "move_mount": (429, 0, 0, 0, 0, 0),
    "mount_setattr": (442, 0, 0, 0, 0, 0),
    "open_tree_attr": (467, -100, 0, 1, 0, 0),
    "listmount": (458, 0, 0, 0, 0),
    "statmount": (457, 0, 0, 0, 0),
    "open_by_handle_at": (304, 0, 0, 0),
    "name_to_handle_at": (303, -100, 0, 0, 0, 0),
    "personality": (135, 0xFFFFFFFF),
    "chroot": (161, 0),
    "pivot_root": (155, 0, 0),
    "quotactl": (179, 0, 0, 0, 0),
    "quotactl_fd": (443, 0, 0, 0, 0),
    "socketpair": (53, 1, 1, 0, 0),
    "accept4": (288, 0, 0, 0, 0),
    "iopl": (172, 3),
    "ioperm": (173, 0, 1, 1),
    "modify_ldt": (154, 0, 0, 0),
    "kexec_load": (246, 0, 0, 0, 0),
    "init_module": (175, 0, 0, 0),
}


_REFUSED_IN_BOTH_VARIANTS = ("socketpair", "accept4", "ptrace", "unshare", "bpf", "io_uring_setup")


def test_dangerous_syscalls_are_refused_inside_the_worker() -> None:
    def body() -> dict[str, object]:
        out: dict[str, object] = {name: _sys(*call) for name, call in _REFUSED.items()}
        out["memfd_create"] = _errno_of(lambda: os.memfd_create("x"))
        r, _ = os.pipe()  # an fd of its own to try fexecve on (memfd_create is refused)
        out["fexecve_memfd"] = _errno_of(lambda: os.execve(r, ["x"], {}))
        out["proc_self_mem"] = _errno_of(lambda: os.open("/proc/self/mem", os.O_RDWR))
        out["proc_parent_environ"] = _errno_of(
            lambda: os.open(f"/proc/{os.getppid()}/environ", os.O_RDONLY)
        )
        out["signal_parent"] = _errno_of(lambda: os.kill(os.getppid(), 0))
        out["pidfd_signal_parent"] = _sys(424, _sys_pidfd(os.getppid()), 0, 0, 0)
        return out

    out = _in_hardened_child(body)
    for name in (*_REFUSED, "fexecve_memfd", "memfd_create"):
        assert out[name] == errno.EPERM, (name, out)
    for name in ("proc_self_mem", "proc_parent_environ"):
        assert out[name] in _EPERM_OR_EACCES, (name, out)
    # Signals to other processes are refused by Landlock's signal scope (ABI >= 6).
    assert out["signal_parent"] == errno.EPERM, out
    assert out["pidfd_signal_parent"] in (errno.EPERM, errno.EBADF), out


def _sys_pidfd(pid: int) -> int:
    libc = _libc()
    return int(libc.syscall(ctypes.c_long(434), ctypes.c_long(pid), ctypes.c_long(0)))


# -- the filter program itself, evaluated offline -----------------------------------------

_AUDIT_ARCH_X86_64 = 0xC000003E
_AUDIT_ARCH_I386 = 0x40000003
_ALLOW = 0x7FFF0000
_KILL_PROCESS = 0x80000000


def _run_filter(
    program: bytes, nr: int, arch: int = _AUDIT_ARCH_X86_64, arg0: int = 0, *more: int
) -> int:
    """A classic-BPF interpreter for the instructions the filter uses, over `seccomp_data`."""
    args = (arg0, *more, 0, 0, 0, 0, 0)[:6]
    data = struct.pack("=iIQ6Q", nr, arch, 0, *args)
    insns = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x06:  # ret k
            return int(k)
        elif code in (0x15, 0x35, 0x45):  # jeq, jge, jset
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        else:
            raise AssertionError(f"unexpected BPF opcode {code:#x}")


_EPERM_RET = 0x00050000 | errno.EPERM
_ENOSYS_RET = 0x00050000 | errno.ENOSYS
_WORKER_PID = 4242  # what `_seccomp` writes into the pid slots after fork


def _expected_verdict(nr: int, args: tuple[int, int, int], *, scoped: bool) -> int:
    """What the filter must answer, written from its documented rules rather than its code."""
    arg0, arg1, arg2 = args
    if nr > A._LAST_REVIEWED_SYSCALL:
        return _ENOSYS_RET
    if nr == A._NR_CLONE3:
        return _ENOSYS_RET
    if nr not in A._ALLOWED_SYSCALLS.values():
        return _EPERM_RET  # the allow list: anything unlisted is refused
    if nr == A._NR_CLONE:
        if arg0 & A._CLONE_NEW_ANY or not arg0 & A._CLONE_THREAD:
            return _EPERM_RET
        return _ALLOW
    if nr in A._SELF_ONLY_SYSCALLS:
        return _ALLOW if arg0 == 0 else _EPERM_RET
    if nr == A._NR_PRCTL:
        return _ALLOW if arg0 in A._PRCTL_OPTIONS else _EPERM_RET
    if nr == A._NR_IOCTL:
        return _ALLOW if arg1 in A._IOCTL_REQUESTS else _EPERM_RET
    if scoped:
        if nr in A._SIGNAL_TO_PID_SYSCALLS:
            return _ALLOW if arg0 == _WORKER_PID else _EPERM_RET
        if nr == A._NR_FCNTL and arg1 == A._F_SETOWN_EX:
            return _EPERM_RET
        if nr == A._NR_FCNTL and arg1 == A._F_SETOWN:
            return _ALLOW if arg2 == _WORKER_PID else _EPERM_RET
    return _ALLOW


def _patched_program(scoped: bool) -> bytes:
    program = bytearray(build_seccomp_program(scope_signals=scoped))
    for off in pid_slot_offsets(bytes(program)):
        struct.pack_into("=I", program, off, _WORKER_PID)
    return bytes(program)


@pytest.mark.parametrize("scoped", [False, True], ids=["landlock-scopes-signals", "filter-scopes"])
def test_every_syscall_gets_the_verdict_its_rules_give(scoped: bool) -> None:
    # Every number up to past the reviewed table, with arguments that hit each rule's
    # branches: one jump offset wrong anywhere lets everything after it through (the
    # signal-scoped program once allowed every syscall after its ioctl rule).
    program = _patched_program(scoped)
    arg_sets = [
        (0, 0, 0),
        (_WORKER_PID, A._F_SETOWN, _WORKER_PID),
        (1, A._F_SETOWN, 1),
        (_WORKER_PID, A._F_SETOWN_EX, _WORKER_PID),
        (3, A._SETOWN_IOCTLS[0], 0),
        (3, A._SETOWN_IOCTLS[1], 0),
        (A._CLONE_THREAD, 0, 0),
        (A._CLONE_THREAD | 0x40000000, 0, 0),  # CLONE_NEWNET on a thread
        (0xFFFFFFFF, 0, 0),
        (1, 0x8912, 0),  # ioctl SIOCGIFCONF: the host's interfaces
        *((option, 0, 0) for option in (*A._PRCTL_OPTIONS, 4, 22, 36, 0x59616D61)),
        *((3, request, 0) for request in (*A._IOCTL_REQUESTS, 0x5412)),  # 0x5412 TIOCSTI
    ]
    for nr in range(A._LAST_REVIEWED_SYSCALL + 40):
        for args in arg_sets:
            got = _run_filter(program, nr, _AUDIT_ARCH_X86_64, *args)
            assert got == _expected_verdict(nr, args, scoped=scoped), (nr, args, hex(got))
    # And by name, independently of the tables: the calls the issue names stay refused.
    for nr in (59, 322, 57, 58, 41, 53, 42, 49, 50, 101, 272, 308, 165, 321, 250):
        assert _run_filter(program, nr) == _EPERM_RET, nr


@pytest.mark.parametrize("scoped", [False, True], ids=["landlock-scopes-signals", "filter-scopes"])
def test_everything_the_old_deny_list_refused_stays_refused(scoped: bool) -> None:
    program = _patched_program(scoped)
    for nr in A._FORMERLY_DENIED_SYSCALLS:
        for args in ((0, 0, 0), (_WORKER_PID, 0, 0), (A._CLONE_THREAD, 0, 0)):
            assert _run_filter(program, nr, _AUDIT_ARCH_X86_64, *args) == _EPERM_RET, nr


# Unlisted by the allow list, let through by the deny list before it (x86_64 numbers):
# none is needed by a worker, several have a history of kernel bugs or reach outside it.
_NEWLY_REFUSED = {
    "open": (2, 0, 0),  # no file opens even without Landlock
    "openat": (257, -100, 0, 0),
    "openat2": (437, -100, 0, 0, 0),
    "memfd_create": (319, 0, 0),
    "memfd_secret": (447, 0),
    "pidfd_open": (434, 1, 0),
    "io_setup": (206, 1, 0),
    "splice": (275, -1, 0, -1, 0, 1, 0),
    "vmsplice": (278, -1, 0, 0, 0),
    "mbind": (237, 0, 0, 0, 0, 0, 0),
    "set_mempolicy": (238, 0, 0, 0),
    "seccomp": (317, 0, 0, 0),
    "landlock_create_ruleset": (444, 0, 0, 1),
    "lookup_dcookie": (212, 0, 0, 0),
    "mknodat": (259, -100, 0, 0, 0),
    "unlinkat": (263, -100, 0, 0),
    "arch_prctl": (158, 0x1003, 0),  # ARCH_GET_FS
    "tkill": (200, 1, 0),
    "prctl_set_dumpable": (157, 4, 1),
    "prctl_set_ptracer_any": (157, 0x59616D61, -1),
}


def test_calls_the_deny_list_allowed_are_now_refused_in_a_hardened_child() -> None:
    def body() -> dict[str, object]:
        out: dict[str, object] = {name: _sys(*call) for name, call in _NEWLY_REFUSED.items()}
        out["siocgifconf"] = _sys(16, 3, 0x8912, 0)  # on a closed fd: EBADF when reached
        out["prctl_get_nnp"] = _sys(157, 39, 0, 0, 0, 0)  # allowed: returns 1
        out["fionread"] = _sys(16, -1, 0x541B, 0)  # allowed request: EBADF from the kernel
        return out

    out = _in_hardened_child(body)
    for name in (*_NEWLY_REFUSED, "siocgifconf"):
        assert out[name] == errno.EPERM, (name, out)
    assert out["prctl_get_nnp"] == "ok"
    assert out["fionread"] == errno.EBADF


def test_filter_refuses_syscalls_newer_than_its_review() -> None:
    program = build_seccomp_program()
    # Numbers past the table the allow list was reviewed against: ENOSYS, never allowed.
    for nr in range(470, 1024):
        assert _run_filter(program, nr) == 0x00050000 | errno.ENOSYS, nr
    assert _run_filter(program, 39) == _ALLOW  # getpid
    assert _run_filter(program, 20, arch=_AUDIT_ARCH_I386) == _KILL_PROCESS
    assert _run_filter(program, 0x40000000 | 39) == 0x00050000 | errno.EPERM


def test_filter_lets_prlimit_and_affinity_address_only_the_worker_itself() -> None:
    program = build_seccomp_program()
    eperm = 0x00050000 | errno.EPERM
    for nr in (302, 203):  # prlimit64, sched_setaffinity
        assert _run_filter(program, nr, arg0=0) == _ALLOW
        assert _run_filter(program, nr, arg0=1) == eperm
        assert _run_filter(program, nr, arg0=0xFFFFFFFF) == eperm


# -- signals without Landlock's signal scope (ABI < 6, or no Landlock at all) --------------


def test_signals_reach_only_the_worker_itself_without_landlock_scoping() -> None:
    # The worker shares the host's process group and uid: kill(0, ...) or kill(ppid, ...)
    # would reach the host and the fork server. Signal 0 only checks permission.
    plan = prepare_hardening(_LIMITS, _force_unavailable=("landlock_fs",))
    r, w = os.pipe()
    pid = fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(r)
            report = apply_hardening(plan, keep_fds=[w], require=("seccomp",))
            got: list[int] = []
            signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
            signal.raise_signal(signal.SIGUSR1)  # tgkill(self): still allowed
            out = {
                "landlock": "landlock_fs" in report.active,
                "raised": got,
                "kill_self": _errno_of(lambda: os.kill(os.getpid(), 0)),
                "kill_parent": _errno_of(lambda: os.kill(os.getppid(), 0)),
                "kill_group": _errno_of(lambda: os.kill(0, 0)),
                "kill_everyone": _errno_of(lambda: os.kill(-1, 0)),
                "tgkill_parent": _sys(234, os.getppid(), os.getppid(), 0),
                "sigqueue_parent": _sys(129, os.getppid(), 0, 0),
                "pidfd_send_signal": _sys(424, 0, 0, 0, 0),
                "setown_self": _errno_of(lambda: fcntl.fcntl(w, fcntl.F_SETOWN, os.getpid())),
                "setown_parent": _errno_of(lambda: fcntl.fcntl(w, fcntl.F_SETOWN, os.getppid())),
                "setown_group": _errno_of(lambda: fcntl.fcntl(w, fcntl.F_SETOWN, -os.getpgrp())),
                "fiosetown": _sys(16, w, 0x8901, 0),
                # The rest of the filter holds in this variant too.
                **{name: _sys(*_REFUSED[name]) for name in _REFUSED_IN_BOTH_VARIANTS},
            }
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        out = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert out["landlock"] is False
    assert out["raised"] == [1]
    assert out["kill_self"] == "ok"
    assert out["setown_self"] == "ok"
    for name in (
        "kill_parent",
        "kill_group",
        "kill_everyone",
        "tgkill_parent",
        "sigqueue_parent",
        "pidfd_send_signal",
        "setown_parent",
        "setown_group",
        "fiosetown",
        *_REFUSED_IN_BOTH_VARIANTS,
    ):
        assert out[name] == errno.EPERM, (name, out)


def test_pid_slots_are_only_in_the_signal_scoped_program() -> None:
    assert pid_slot_offsets(build_seccomp_program()) == ()
    scoped = build_seccomp_program(scope_signals=True)
    assert len(pid_slot_offsets(scoped)) == 3  # kill tgkill F_SETOWN
