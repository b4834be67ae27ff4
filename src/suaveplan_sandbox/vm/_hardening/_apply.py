"""Hardening layers for a forked worker: fds, env, rlimits, no_new_privs, Landlock, seccomp.

Hand-written raw syscalls via ctypes, because the PyPI `landlock` package is a pre-release
(1.0.0.dev5), `pyseccomp` is unmaintained since 2021, and libseccomp's Python bindings are
not on PyPI. x86_64 Linux only; on anything else the kernel layers are reported missing.

The seccomp filter is an allow list (`_ALLOWED_SYSCALLS`, drawn from a survey of what
workers make on Python 3.11-3.13: `scripts/seccomp_survey.py`): everything else returns
EPERM, including opening files (Landlock's job too, but nothing else stopped it on a kernel
without Landlock), file metadata changes, SysV IPC, other processes' rlimits and scheduling,
which Landlock does not govern; `no_new_privs` also empties the capability sets (a root fork
server's worker would hold them all). `clone3` and syscall numbers newer than the reviewed
table return ENOSYS, which is what makes glibc and other callers fall back.

Threads: `clone` is allowed only with CLONE_THREAD and no namespace flag, so threads work and
processes do not; `clone3` returns ENOSYS so glibc falls back to `clone`. RLIMIT_NPROC counts
threads too (per real uid, and root ignores it), so `RLIMIT_NPROC=0` would block threads for
a non-root worker only: it is set only when seccomp cannot be applied (then it is the process
backstop, and threads are blocked as well). Signals to other processes are blocked by
Landlock scoped signals when the ABI is >= 6, and otherwise by the filter (kill, tgkill and
F_SETOWN only to the worker's own pid, patched into its copy of the program after fork).

Cost: a forked worker pays about 3.5 µs for every page it writes first (copy-on-write, and
more on a VM), which makes touching Python objects, not syscalls, the price of hardening.
So everything that is the same for every worker is built once in the fork server
(`prepare_hardening`): the libc entry points, the seccomp program in its `sock_fprog`, the
Landlock ruleset attribute block. The child makes one plain call per layer with them.

CPU: RLIMIT_CPU counts a process's whole life, so the backstop is re-armed per call: the soft
limit is set to the CPU used so far plus `cpu_seconds` (SIGXCPU kills the worker) and the
hard limit stays unlimited so it can be moved. It only fires if the host's sampling watchdog
did not end the call first (host stuck or gone).
"""

from __future__ import annotations

# The C signal module: `signal.signal` wraps it with enum conversions that cost a forked child
# dozens of page faults (and an exception when the old handler is a function).
import _signal  # type: ignore[import-not-found]  # CPython's own; no stub
import contextlib
import ctypes
import errno
import fcntl
import math
import os
import platform
import resource
import select
import signal
import struct
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, final

from suaveplan_sandbox.errors import SuaveplanError

_NATIVE_OK: Final = sys.platform == "linux" and platform.machine() == "x86_64"

LAYERS: Final = ("fds", "env", "rlimits", "no_new_privs", "landlock_fs", "landlock_net", "seccomp")

_SYS_LANDLOCK_CREATE_RULESET: Final = 444
_SYS_LANDLOCK_RESTRICT_SELF: Final = 446
_LANDLOCK_CREATE_RULESET_VERSION: Final = 1
_PR_SET_NO_NEW_PRIVS: Final = 38
_PR_SET_SECCOMP: Final = 22
_LINUX_CAPABILITY_VERSION_3: Final = 0x20080522
_SECCOMP_MODE_FILTER: Final = 2

_AUDIT_ARCH_X86_64: Final = 0xC000003E
_RET_KILL_PROCESS: Final = 0x80000000
_RET_ERRNO: Final = 0x00050000
_RET_ALLOW: Final = 0x7FFF0000
_CLONE_THREAD: Final = 0x00010000
_X32_BIT: Final = 0x40000000
_NR_CLONE: Final = 56
_NR_CLONE3: Final = 435

# The allow list: the x86_64 syscalls a hardened worker may make; every other one returns
# EPERM (numbers past `_LAST_REVIEWED_SYSCALL`, and `clone3`, return ENOSYS: see there).
# Drawn from a survey of what workers make once the filter is installed, on Python 3.11,
# 3.12 and 3.13 (glibc 2.36), over the VM and security suites and a plugin that uses every
# allowlisted stdlib module: `scripts/seccomp_survey.py`, recorded in
# `tests/vm/hardening/seccomp_survey.json`, which a test checks against this table. Older
# glibc spells some calls differently (`stat` for `newfstatat`, `select` for `pselect6`,
# `pipe` for `pipe2`, ...): both spellings are listed. Hot calls first: the filter tests
# them in this order. What is deliberately absent although the old deny list let it through:
# opening files (Landlock's job too, but without Landlock nothing else stopped it), `memfd_*`,
# `pidfd_*`, `io_*` AIO, `splice`/`vmsplice`/`tee`, `mbind`/`set_mempolicy`, `seccomp`,
# `landlock_*`, `rt_*sigqueueinfo`, `tkill`, the futex2 calls, `arch_prctl`, `uselib`, and
# `uname`/`sysinfo` (the host's kernel release and load: nothing a worker needs). About half
# the table was seen in the survey; the rest are older glibc's spellings of the same calls
# and the signal, sleep and fd basics glibc and CPython make on paths the suites do not take
# (`restart_syscall`, `rt_sigtimedwait`, `sigaltstack`, `dup*`, `poll`...).
#
# The refusal is EPERM, as the deny list's was: Python raises PermissionError for it (what the
# guest's error translation and the tests expect), container runtimes' default profiles
# answer unlisted calls the same way, and where glibc or CPython fall back on a refusal they
# accept EPERM too (os.urandom's getrandom). ENOSYS is kept for the two places where a
# fallback depends on it: `clone3` (glibc retries with `clone` on ENOSYS only) and numbers
# past the reviewed table (a future libc probing a new call must see "too old a kernel").
# Nothing unlisted kills the process; only a foreign architecture does, as before.
_ALLOWED_SYSCALLS: Final = {
    # the IPC channel and its busy poll (the hot path), the per-call CPU backstop
    "recvfrom": 45, "sendto": 44, "sched_yield": 24, "getrusage": 98, "clock_gettime": 228,
    # the worker's own memory: malloc, big allocations, thread stacks
    "mmap": 9, "munmap": 11, "brk": 12, "mremap": 25, "mprotect": 10, "madvise": 28,
    # its own descriptors (rules below for fcntl and ioctl)
    "read": 0, "write": 1, "readv": 19, "writev": 20, "sendmsg": 46, "recvmsg": 47,
    "close": 3, "fcntl": 72, "ioctl": 16, "dup": 32, "dup2": 33, "dup3": 292,
    "pipe": 22, "pipe2": 293, "poll": 7, "ppoll": 271, "select": 23, "pselect6": 270,
    "getsockname": 51, "getpeername": 52, "getsockopt": 55,
    # path metadata, which Landlock does not govern and Python's import machinery reads
    "fstat": 5, "stat": 4, "lstat": 6, "newfstatat": 262, "statx": 332,
    "access": 21, "faccessat": 269, "faccessat2": 439, "readlink": 89, "readlinkat": 267,
    "getcwd": 79,
    # signals (kill and tgkill are scoped to the worker below when Landlock does not)
    "rt_sigaction": 13, "rt_sigprocmask": 14, "rt_sigreturn": 15, "sigaltstack": 131,
    "rt_sigpending": 127, "rt_sigtimedwait": 128, "rt_sigsuspend": 130, "pause": 34,
    "alarm": 37, "getitimer": 36, "setitimer": 38, "kill": 62, "tgkill": 234,
    "restart_syscall": 219,  # the kernel resumes a sleep or wait interrupted by a stop
    # time
    "clock_getres": 229, "gettimeofday": 96, "time": 201, "nanosleep": 35,
    "clock_nanosleep": 230, "times": 100,
    # threads (clone only as a thread, see below) and exiting
    "clone": 56, "futex": 202, "set_robust_list": 273, "rseq": 334, "set_tid_address": 218,
    "exit": 60, "exit_group": 231, "gettid": 186, "getcpu": 309,
    "sched_getaffinity": 204, "sched_setaffinity": 203,
    # reading its own identity, limits and randomness (prlimit64 and prctl: rules below)
    "getpid": 39, "getppid": 110, "getuid": 102, "geteuid": 107, "getgid": 104,
    "getegid": 108, "getgroups": 115, "getresuid": 118, "getresgid": 120, "getpgrp": 111,
    "getpgid": 121, "getsid": 124, "getrlimit": 97,
    "prlimit64": 302, "capget": 125, "prctl": 157, "getrandom": 318,
}  # fmt: skip

# What the old deny list refused by name, kept as the regression set: each of these must
# stay refused whatever the allow list grows into (a test checks it). x86_64 numbers.
_FORMERLY_DENIED_SYSCALLS: Final = (
    59, 322, 57, 58,  # execve execveat fork vfork
    41, 53, 42, 49, 50, 43, 288,  # socket socketpair connect bind listen accept accept4
    101, 310, 311, 438, 312,  # ptrace process_vm_readv/writev pidfd_getfd kcmp
    440, 448, 256, 279,  # process_madvise process_mrelease migrate_pages move_pages
    141, 251, 142, 144, 314,  # setpriority ioprio_set sched_setparam/setscheduler/setattr
    272, 308, 165, 166, 155, 161,  # unshare setns mount umount2 pivot_root chroot
    428, 429, 430, 431, 432, 433, 442, 467,  # new mount API, mount_setattr, open_tree_attr
    457, 458,  # statmount listmount
    321, 250, 248, 249, 298,  # bpf keyctl add_key request_key perf_event_open
    246, 320, 175, 313, 176,  # kexec_load kexec_file_load init/finit/delete_module
    323, 425, 426, 427, 304, 303,  # userfaultfd io_uring_* open_by_handle_at name_to_handle_at
    135, 169, 167, 168, 163, 179, 443,  # personality reboot swapon swapoff acct quotactl(_fd)
    170, 171, 164, 227,  # sethostname setdomainname settimeofday clock_settime
    159, 305,  # adjtimex clock_adjtime
    103, 172, 173, 154, 153, 134,  # syslog iopl ioperm modify_ldt vhangup uselib
    300, 301, 253, 254, 294,  # fanotify_init/mark inotify_init/add_watch/init1
    90, 91, 268, 452,  # chmod fchmod fchmodat fchmodat2
    92, 93, 94, 260,  # chown fchown lchown fchownat
    132, 235, 261, 280,  # utime utimes futimesat utimensat
    188, 189, 190, 197, 198, 199, 463, 466,  # setxattr family, removexattr family
    191, 192, 194, 195, 464, 465,  # getxattr/listxattr by path
    468, 469,  # file_getattr file_setattr
    29, 30, 31, 67,  # shmget shmat shmctl shmdt
    64, 65, 66, 220,  # semget semop semctl semtimedop
    68, 69, 70, 71,  # msgget msgsnd msgrcv msgctl
    240, 241, 242, 243, 244, 245,  # mq_open mq_unlink mq_timedsend/timedreceive/notify/getsetattr
    200, 424, 129, 297,  # tkill pidfd_send_signal rt_sigqueueinfo rt_tgsigqueueinfo
)  # fmt: skip

# Allowed only with a pid of 0 (the worker itself): glibc's setrlimit is prlimit64(0, ...),
# and the CPU backstop needs it; another process of the same uid is out of bounds.
_SELF_ONLY_SYSCALLS: Final = (302, 203)  # prlimit64 sched_setaffinity

# prctl only for what reads the worker's own state or names its own threads and memory
# (glibc and Python >= 3.14 name threads; glibc may name its mappings); the rest of
# prctl's options (dumpable, ptracer, child subreaper, PR_SET_MM, more seccomp...) refused.
_NR_PRCTL: Final = 157
_PRCTL_OPTIONS: Final = (
    3,  # PR_GET_DUMPABLE
    15,  # PR_SET_NAME
    16,  # PR_GET_NAME
    21,  # PR_GET_SECCOMP
    39,  # PR_GET_NO_NEW_PRIVS
    0x53564D41,  # PR_SET_VMA (naming anonymous memory)
)

# ioctl only for requests on the worker's own descriptors that Python and glibc make
# (blocking mode, close-on-exec, isatty, pending bytes, terminal size); the rest (socket
# ioctls that list the host's interfaces, FIOSETOWN/SIOCSPGRP, tty injection...) refused.
_NR_IOCTL: Final = 16
_IOCTL_REQUESTS: Final = (
    0x5421,  # FIONBIO
    0x5451,  # FIOCLEX
    0x5450,  # FIONCLEX
    0x5401,  # TCGETS (isatty)
    0x541B,  # FIONREAD
    0x5413,  # TIOCGWINSZ
)

# The highest syscall number the table was reviewed against (Linux 6.17's table); anything
# newer returns ENOSYS, as on an older kernel, so a future libc that probes a new call
# falls back instead of failing on EPERM.
_LAST_REVIEWED_SYSCALL: Final = 469

# Without Landlock's signal scope (ABI < 6, or no Landlock), a worker in the host's process
# group and uid could signal the host, the fork server and its siblings. The filter then
# lets these address only the worker itself: `_PID_SLOT` is replaced by its pid after fork.
# (tkill, pidfd_send_signal and rt_*sigqueueinfo are not on the allow list at all.)
_SIGNAL_TO_PID_SYSCALLS: Final = (62, 234)  # kill tgkill
_NR_FCNTL: Final = 72
_F_SETOWN: Final = 8
_F_SETOWN_EX: Final = 15
_SETOWN_IOCTLS: Final = (0x8901, 0x8902)  # FIOSETOWN SIOCSPGRP: not in _IOCTL_REQUESTS
_PID_SLOT: Final = 0xFFFFFFFF

# CLONE_NEWNS CLONE_NEWCGROUP CLONE_NEWUTS CLONE_NEWIPC CLONE_NEWUSER CLONE_NEWPID
# CLONE_NEWNET CLONE_NEWTIME: refused even for a thread.
_CLONE_NEW_ANY: Final = 0x00020000 | 0x7E000000 | 0x00000080


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


_LD_ABS: Final = 0x20
_JEQ: Final = 0x15
_JGE: Final = 0x35
_JSET: Final = 0x45
_RET: Final = 0x06
_MAX_JUMP: Final = 255  # a conditional jump's offset is one byte


def _arg_in(nr: int, offset: int, values: Collection[int], refusal: int) -> list[bytes]:
    """Syscall `nr` is allowed when the 32-bit word at `offset` of `seccomp_data` is one of
    `values`, else refused; any other syscall goes on to the next rule."""
    n = len(values)
    block = [_insn(_JEQ, 0, n + 3, nr), _insn(_LD_ABS, 0, 0, offset)]
    block += [_insn(_JEQ, n - i, 0, value) for i, value in enumerate(values)]
    block += [_insn(_RET, 0, 0, refusal), _insn(_RET, 0, 0, _RET_ALLOW)]
    return block


def _first_arg_must_be(nr: int, value: int, refusal: int) -> list[bytes]:
    """Syscall `nr` is allowed when its first argument's low word is `value` (a pid_t is
    all the kernel reads), else refused."""
    return _arg_in(nr, 16, (value,), refusal)


def _any_of(numbers: Sequence[int], refusal: int) -> list[bytes]:
    """The plain allow list: a match jumps to the RET ALLOW at the end, no match falls
    through to `refusal`. A jump's offset is one byte, hence the limit on the table."""
    n = len(numbers)
    if n > _MAX_JUMP:
        raise ValueError(f"{n} plain allowed syscalls: more than one jump can span")
    prog = [_insn(_JEQ, n - i, 0, nr) for i, nr in enumerate(numbers)]
    return [*prog, _insn(_RET, 0, 0, refusal), _insn(_RET, 0, 0, _RET_ALLOW)]


def build_seccomp_program(*, scope_signals: bool = False) -> bytes:
    """The BPF filter as raw `sock_filter` bytes (8 bytes an instruction).

    An allow list: the syscalls in `_ALLOWED_SYSCALLS` pass (some only with the arguments
    their rule admits), every other one returns EPERM; `clone3` and numbers past the
    reviewed table return ENOSYS; the x32 ABI returns EPERM; a foreign architecture kills.
    `scope_signals`: signals only to the worker itself (see `_SIGNAL_TO_PID_SYSCALLS`); the
    program then holds `_PID_SLOT` constants for `pid_slot_offsets` to patch.
    """
    eperm = _RET_ERRNO | errno.EPERM
    prog = [
        _insn(_LD_ABS, 0, 0, 4),  # arch
        _insn(_JEQ, 1, 0, _AUDIT_ARCH_X86_64),
        _insn(_RET, 0, 0, _RET_KILL_PROCESS),
        _insn(_LD_ABS, 0, 0, 0),  # nr
        _insn(_JGE, 0, 1, _X32_BIT),
        _insn(_RET, 0, 0, eperm),
        _insn(_JGE, 0, 1, _LAST_REVIEWED_SYSCALL + 1),
        _insn(_RET, 0, 0, _RET_ERRNO | errno.ENOSYS),
        _insn(_JEQ, 0, 5, _NR_CLONE),
        _insn(_LD_ABS, 0, 0, 16),  # args[0] low word: clone flags
        _insn(_JSET, 2, 0, _CLONE_NEW_ANY),
        _insn(_JSET, 0, 1, _CLONE_THREAD),
        _insn(_RET, 0, 0, _RET_ALLOW),
        _insn(_RET, 0, 0, eperm),
        # glibc >= 2.34 tries clone3 first and falls back to clone on ENOSYS only; its
        # flags are behind a pointer, which a filter cannot read.
        _insn(_JEQ, 0, 1, _NR_CLONE3),
        _insn(_RET, 0, 0, _RET_ERRNO | errno.ENOSYS),
    ]
    # args[n] is at 16 + 8n; a pid_t or an int command is its low word, all the kernel reads.
    for nr in _SELF_ONLY_SYSCALLS:
        prog += _first_arg_must_be(nr, 0, eperm)
    prog += _arg_in(_NR_PRCTL, 16, _PRCTL_OPTIONS, eperm)
    prog += _arg_in(_NR_IOCTL, 24, _IOCTL_REQUESTS, eperm)
    ruled = {_NR_CLONE, *_SELF_ONLY_SYSCALLS, _NR_PRCTL, _NR_IOCTL}
    if scope_signals:
        for nr in _SIGNAL_TO_PID_SYSCALLS:
            prog += _first_arg_must_be(nr, _PID_SLOT, eperm)
        # fcntl F_SETOWN (SIGIO/SIGURG go to the owner) only to itself; F_SETOWN_EX never.
        prog.append(_insn(_JEQ, 0, 8, _NR_FCNTL))
        prog.append(_insn(_LD_ABS, 0, 0, 24))
        prog.append(_insn(_JEQ, 5, 0, _F_SETOWN_EX))
        prog.append(_insn(_JEQ, 1, 0, _F_SETOWN))
        prog.append(_insn(_RET, 0, 0, _RET_ALLOW))
        prog.append(_insn(_LD_ABS, 0, 0, 32))
        prog.append(_insn(_JEQ, 0, 1, _PID_SLOT))
        prog.append(_insn(_RET, 0, 0, _RET_ALLOW))
        prog.append(_insn(_RET, 0, 0, eperm))
        ruled |= {*_SIGNAL_TO_PID_SYSCALLS, _NR_FCNTL}
    prog += _any_of([nr for nr in _ALLOWED_SYSCALLS.values() if nr not in ruled], eperm)
    return b"".join(prog)


def pid_slot_offsets(program: bytes) -> tuple[int, ...]:
    """Byte offsets of the `k` fields that `build_seccomp_program(scope_signals=True)` left
    as `_PID_SLOT` for the worker's pid (only jump-if-equal instructions use it)."""
    return tuple(
        off + 4
        for off in range(0, len(program), 8)
        if struct.unpack_from("=HBBI", program, off)[::3] == (_JEQ, _PID_SLOT)
    )


def cpu_backstop_seconds(wall_clock_ms: int | float | None) -> int | None:
    """Per-call RLIMIT_CPU backstop for a wallClockMs budget: one core for the whole budget
    plus a second, so it never fires before the host's watchdog would; None without one."""
    if wall_clock_ms is None:
        return None
    return math.ceil(wall_clock_ms / 1000) + 1


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RlimitSettings:
    """Backstop rlimits; `None` means leave that limit unlimited.

    `cpu_seconds` is per call (see `arm_cpu_backstop`), not per worker lifetime.
    """

    address_space_bytes: int | None
    cpu_seconds: int | None
    open_files: int = 64
    file_size_bytes: int = 0
    processes: int = 0
    core_bytes: int = 0


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HardeningPlan:
    """Everything probed and built once in the fork server, so a fork pays neither."""

    rlimits: RlimitSettings
    landlock_abi: int | None
    landlock_why: str
    seccomp_program: bytes | None
    seccomp_why: str
    unavailable: Mapping[str, str] = field(default_factory=dict)
    # Built from the fields above by `prepare_hardening`; None where the kernel layers
    # cannot be applied at all (not Linux x86_64), or in a plan built by hand.
    native: _Native | None = field(default=None, compare=False, repr=False)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HardeningReport:
    """Which layers took effect, which did not and why, and the Landlock ABI used."""

    active: tuple[str, ...]
    missing: dict[str, str]
    landlock_abi: int | None

    def __post_init__(self) -> None:
        for name in (*self.active, *self.missing):
            if name not in LAYERS:
                raise ValueError(f"unknown hardening layer {name!r}")
        if set(self.active) & set(self.missing):
            raise ValueError("a layer cannot be both active and missing")

    def to_wire(self) -> dict[str, object]:
        return {
            "active": list(self.active),
            "missing": dict(self.missing),
            "landlock_abi": self.landlock_abi,
        }

    @classmethod
    def from_wire(cls, data: object) -> HardeningReport:
        if not isinstance(data, dict):
            raise ValueError("hardening report must be a mapping")
        active = data.get("active")
        missing = data.get("missing")
        abi = data.get("landlock_abi")
        if not isinstance(active, list) or not all(isinstance(a, str) for a in active):
            raise ValueError("active must be a list of str")
        if not isinstance(missing, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in missing.items()
        ):
            raise ValueError("missing must map str to str")
        if abi is not None and (not isinstance(abi, int) or isinstance(abi, bool)):
            raise ValueError("landlock_abi must be an int or None")
        return cls(active=tuple(active), missing=dict(missing), landlock_abi=abi)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def _landlock_ruleset_attr(abi: int, net: bool) -> tuple[bytes, int]:
    """`struct landlock_ruleset_attr` handling every right this ABI knows (no rule grants
    any), and its size for this ABI."""
    fs = (1 << 13) - 1
    if abi >= 2:
        fs |= 1 << 13  # REFER
    if abi >= 3:
        fs |= 1 << 14  # TRUNCATE
    if abi >= 5:
        fs |= 1 << 15  # IOCTL_DEV
    handled_net = 0b11 if net and abi >= 4 else 0  # BIND_TCP | CONNECT_TCP
    scoped = 0b11 if abi >= 6 else 0  # ABSTRACT_UNIX_SOCKET | SIGNAL
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    return struct.pack("=QQQ", fs, handled_net, scoped), size


@final
class _Native:
    """libc entry points with their argument types, and the kernel argument blocks, made
    once before forking. Keeps the buffers the blocks point into alive."""

    __slots__ = (
        "capset",
        "capset_data",
        "capset_header",
        "clearenv",
        "landlock_attr",
        "landlock_size",
        "pid_slots",
        "prctl",
        "seccomp_filter",
        "seccomp_prog",
        "syscall",
    )

    def __init__(self, landlock: tuple[bytes, int] | None, seccomp: bytes | None) -> None:
        libc = _libc()
        self.syscall = libc.syscall
        self.syscall.restype = ctypes.c_long
        self.prctl = libc.prctl
        self.prctl.restype = ctypes.c_int
        self.clearenv = libc.clearenv
        self.clearenv.restype = ctypes.c_int
        self.capset = libc.capset
        self.capset.restype = ctypes.c_int
        # capset(2) version 3, this process: every set empty. The kernel only reads these.
        self.capset_header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
        self.capset_data = (ctypes.c_uint32 * 6)()
        self.landlock_attr = None if landlock is None else ctypes.create_string_buffer(landlock[0])
        self.landlock_size = ctypes.c_size_t(0 if landlock is None else landlock[1])
        self.pid_slots = () if seccomp is None else pid_slot_offsets(seccomp)
        if seccomp is None:
            self.seccomp_filter = self.seccomp_prog = None
        else:
            self.seccomp_filter = ctypes.create_string_buffer(seccomp, len(seccomp))
            self.seccomp_prog = _SockFprog(
                len(seccomp) // 8, ctypes.cast(self.seccomp_filter, ctypes.c_void_p)
            )


def _landlock_abi() -> tuple[int | None, str]:
    if not _NATIVE_OK:
        return None, "not linux x86_64"
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    abi = int(
        libc.syscall(
            ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET),
            None,
            ctypes.c_size_t(0),
            ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION),
        )
    )
    if abi < 0:
        return None, f"landlock unavailable: {os.strerror(ctypes.get_errno())}"
    return abi, "ok"


def prepare_hardening(
    rlimits: RlimitSettings, *, _force_unavailable: Collection[str] = ()
) -> HardeningPlan:
    """Probe Landlock and build the seccomp program; call once, before forking.

    `_force_unavailable` is test-only: the named layers are treated as unsupported.
    """
    for name in _force_unavailable:
        if name not in LAYERS:
            raise ValueError(f"unknown hardening layer {name!r}")
    abi, why = _landlock_abi()
    # Landlock scopes signals from ABI 6; without it, the filter does (costing each worker
    # one copied page for its pid).
    scoped_by_landlock = abi is not None and abi >= 6 and "landlock_fs" not in _force_unavailable
    program = build_seccomp_program(scope_signals=not scoped_by_landlock) if _NATIVE_OK else None
    net = "landlock_net" not in _force_unavailable
    return HardeningPlan(
        rlimits=rlimits,
        landlock_abi=abi,
        landlock_why=why,
        seccomp_program=program,
        seccomp_why="ok" if _NATIVE_OK else "not linux x86_64",
        unavailable={name: "forced unavailable (test)" for name in _force_unavailable},
        native=_Native(None if abi is None else _landlock_ruleset_attr(abi, net), program)
        if _NATIVE_OK
        else None,
    )


def probe_hardening() -> dict[str, str]:
    """Which layers this machine supports: "ok" or why not. No side effects."""
    plan = prepare_hardening(RlimitSettings(address_space_bytes=None, cpu_seconds=None))
    result = {name: "ok" for name in LAYERS}
    if plan.landlock_abi is None:
        result["landlock_fs"] = result["landlock_net"] = plan.landlock_why
    elif plan.landlock_abi < 4:
        result["landlock_net"] = f"landlock ABI {plan.landlock_abi} < 4"
    if plan.seccomp_program is None:
        result["seccomp"] = plan.seccomp_why
    return result


class _LayerFailed(Exception):
    pass


def arm_lifeline(fd: int) -> bool:
    """Die with the host: `fd` is the read end of a pipe whose only write end the host holds.

    With `O_ASYNC` and this process as owner, the kernel sends SIGIO when the last writer
    closes (the host exited or was SIGKILLed); SIGIO's default action terminates the process,
    even inside C code, and the worker never handles it. Nothing is ever written to the pipe,
    so it becomes readable only then; if it already is (the host died before this ran), the
    process exits at once. Independent of the fork server: a worker outlives its zygote.
    False where the kernel offers no such signal (not Linux): no guarantee then.
    """
    if sys.platform != "linux":
        return False
    _signal.signal(_SIGIO, _SIG_DFL)
    fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC | os.O_NONBLOCK)
    if select.select((fd,), (), (), 0)[0]:
        os._exit(0)
    return True


_SIGIO: Final = int(signal.SIGIO)
_SIG_DFL: Final = int(signal.SIG_DFL)


def reset_signal_to_default(signum: int) -> None:
    """`signal.signal(signum, SIG_DFL)` without the enum wrapping (cheap in a fork)."""
    _signal.signal(signum, _SIG_DFL)


def _close_fds(keep: Collection[int]) -> None:
    """Close every fd not in `keep`: one close_range(2) a gap. An empty gap is skipped:
    CPython 3.11 turns `closerange(0, 0)` into close_range(0, UINT_MAX), which closes all."""
    low = 0
    for fd in sorted({k for k in keep if k >= 0}):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 2**31 - 1)


def _clear_env(native: _Native | None) -> None:
    if os.environ:  # the fork server's is empty already; clear() would raise and catch
        os.environ.clear()
    clearenv = native.clearenv if native is not None else _libc().clearenv
    if clearenv() != 0:
        raise _LayerFailed("clearenv failed")


_cpu_backstop: int | None = None
_cpu_soft_limit: int | None = None  # what arm_cpu_backstop last set
_applied = False


def hardening_was_applied() -> bool:
    """True in a process that ran `apply_hardening` (a worker), never in the host."""
    return _applied


_cpu_unchanged_until = -math.inf  # monotonic time before which the limit cannot need a reset


def arm_cpu_backstop() -> None:
    """Re-arm the per-call RLIMIT_CPU backstop (soft limit = CPU used + budget); no-op
    outside a hardened worker or without a wallClockMs budget."""
    global _cpu_soft_limit, _cpu_unchanged_until  # noqa: PLW0603 - per worker process
    if _cpu_backstop is None:
        return
    # The limit is only set again once the CPU used passes a whole second (`ceil` changes).
    # The worker has one thread, so its CPU grows no faster than the monotonic clock: until
    # the clock has moved as far as the CPU had left to that second, no reading is needed.
    # The CPU clock is a system call here, the monotonic one is not. (Were there more
    # threads, a skipped reset would leave the older limit, which is lower: stricter.)
    now = time.monotonic()
    if now < _cpu_unchanged_until:
        return
    # The process's user + system CPU, what RLIMIT_CPU counts (a clock read costs less than
    # getrusage).
    used = time.process_time()
    whole = math.ceil(used)
    _cpu_unchanged_until = now + (whole - used)
    soft = whole + _cpu_backstop
    if soft == _cpu_soft_limit:
        return
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
        _cpu_soft_limit = soft


def _set_rlimit(which: int, value: int) -> None:
    try:
        resource.setrlimit(which, (value, value))
    except (OSError, ValueError) as exc:
        raise _LayerFailed(f"setrlimit {which}: {exc}") from exc


def _set_rlimits(args: tuple[RlimitSettings, bool]) -> None:
    global _cpu_backstop  # noqa: PLW0603 - per worker process
    r, nproc = args
    inf = resource.RLIM_INFINITY
    limits = [
        (resource.RLIMIT_AS, inf if r.address_space_bytes is None else r.address_space_bytes),
        (resource.RLIMIT_NOFILE, r.open_files),
        (resource.RLIMIT_FSIZE, r.file_size_bytes),
        (resource.RLIMIT_CORE, r.core_bytes),
    ]
    if nproc:
        limits.append((resource.RLIMIT_NPROC, r.processes))
    for which, value in limits:
        _set_rlimit(which, value)
    if r.cpu_seconds is None:
        _set_rlimit(resource.RLIMIT_CPU, inf)
    else:
        if r.cpu_seconds <= 0:
            raise _LayerFailed("cpu_seconds must be positive")
        _cpu_backstop = r.cpu_seconds
        try:
            arm_cpu_backstop()
        except (OSError, ValueError) as exc:
            raise _LayerFailed(f"setrlimit RLIMIT_CPU: {exc}") from exc


def _no_new_privs(native: _Native | None) -> None:
    """No privilege gained later (exec of setuid or file-capability programs), and none kept:
    a worker forked from a root fork server would otherwise hold every capability (set the
    hostname or clock, read the kernel log, raise its hard rlimits back, make namespaces).
    Empty permitted and inheritable sets also empty the ambient set."""
    if native is None:
        raise _LayerFailed("prctl: not linux x86_64")
    if native.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _LayerFailed(f"prctl({_PR_SET_NO_NEW_PRIVS}): {os.strerror(ctypes.get_errno())}")
    if native.capset(native.capset_header, native.capset_data) != 0:
        raise _LayerFailed(f"capset: {os.strerror(ctypes.get_errno())}")


def _landlock(native: _Native | None) -> None:
    if native is None or native.landlock_attr is None:
        raise _LayerFailed("landlock: no ruleset prepared")
    fd = native.syscall(_SYS_LANDLOCK_CREATE_RULESET, native.landlock_attr, native.landlock_size, 0)
    if fd < 0:
        raise _LayerFailed(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        if native.syscall(_SYS_LANDLOCK_RESTRICT_SELF, fd, 0) != 0:
            raise _LayerFailed(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def _seccomp(native: _Native | None) -> None:
    if native is None or native.seccomp_prog is None:
        raise _LayerFailed("seccomp: no program prepared")
    if native.pid_slots:  # signal scoping by seccomp: this worker's own copy of the program
        pid = os.getpid()
        for off in native.pid_slots:
            struct.pack_into("=I", native.seccomp_filter, off, pid)  # type: ignore[arg-type]
    if native.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(native.seccomp_prog), 0, 0):
        raise _LayerFailed(f"seccomp: {os.strerror(ctypes.get_errno())}")


def apply_hardening(
    plan: HardeningPlan,
    *,
    keep_fds: Collection[int],
    rlimits: RlimitSettings | None = None,
    require: Collection[str] = (),
) -> HardeningReport:
    """Apply every layer in LAYERS order, in the forked child; irreversible.

    A layer in `require` that cannot be applied raises SAND_VM_HARDENING_UNAVAILABLE
    (fail closed); any other is reported in `missing`. After a raise the process is partly
    hardened and must exit (`os._exit`), never run plugin code. Import everything the worker
    needs before calling: once Landlock is active no file can be opened.
    """
    global _applied  # noqa: PLW0603 - marks this process as a worker
    for name in require:
        if name not in LAYERS:
            raise ValueError(f"unknown hardening layer {name!r}")
    _applied = True
    active: list[str] = []
    missing: dict[str, str] = {}
    abi = plan.landlock_abi
    native = plan.native
    unavailable = plan.unavailable

    # One layer: `unsupported` (or a forced test outage) skips it; otherwise `action(arg)`.
    # Plain calls, no closures built per layer: every object made here costs the fork pages.
    def run(name: str, unsupported: str | None, action: Callable[[Any], None], arg: Any) -> None:
        why = unavailable.get(name, unsupported) if unavailable else unsupported
        if why is None:
            try:
                action(arg)
            except (_LayerFailed, OSError) as exc:
                why = str(exc)
            else:
                active.append(name)
                return
        if name in require:
            raise SuaveplanError(
                "SAND_VM_HARDENING_UNAVAILABLE",
                f"required hardening layer {name} is unavailable",
                {"layer": name, "why": why},
            )
        missing[name] = why

    run("fds", None, _close_fds, keep_fds)
    run("env", None, _clear_env, native)
    # With seccomp refusing fork/vfork/clone-without-CLONE_THREAD, RLIMIT_NPROC is not needed
    # for processes; left alone it does not block threads for a non-root worker.
    seccomp_planned = plan.seccomp_program is not None and "seccomp" not in unavailable
    limits = rlimits or plan.rlimits
    run("rlimits", None, _set_rlimits, (limits, not seccomp_planned))
    run("no_new_privs", None, _no_new_privs, native)
    if abi is None:
        fs_why: str | None = plan.landlock_why
    elif "no_new_privs" not in active:
        fs_why = "needs no_new_privs"
    else:
        fs_why = None
    run("landlock_fs", fs_why, _landlock, native)
    if abi is not None and abi < 4:
        net_why: str | None = f"landlock ABI {abi} < 4"
    elif "landlock_fs" not in active:
        net_why = "landlock ruleset not applied: " + missing.get("landlock_fs", plan.landlock_why)
    else:
        net_why = None  # the net rights were handled by the ruleset applied above
    run("landlock_net", net_why, _nothing, None)
    sec_why = plan.seccomp_why if plan.seccomp_program is None else None
    run("seccomp", sec_why, _seccomp, native)
    if seccomp_planned and "seccomp" not in active and "rlimits" in active:
        # seccomp was expected but failed: fall back to RLIMIT_NPROC as the process backstop.
        try:
            _set_rlimit(resource.RLIMIT_NPROC, limits.processes)
        except _LayerFailed as exc:
            active.remove("rlimits")
            missing["rlimits"] = str(exc)
            if "rlimits" in require:
                raise SuaveplanError(
                    "SAND_VM_HARDENING_UNAVAILABLE",
                    "required hardening layer rlimits is unavailable",
                    {"layer": "rlimits", "why": str(exc)},
                ) from None
    return HardeningReport(active=tuple(active), missing=missing, landlock_abi=abi)


def _nothing(_: object) -> None:
    """landlock_net: its rights were handled by the ruleset `landlock_fs` applied."""
