"""Each hardening layer blocks from inside a hardened, forked process."""

from __future__ import annotations

import ctypes
import errno
import json
import math
import os
import pickle
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable

import pytest

from _forking import fork
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._hardening import (
    LAYERS,
    HardeningReport,
    RlimitSettings,
    apply_hardening,
    arm_cpu_backstop,
    cpu_backstop_seconds,
    prepare_hardening,
    probe_hardening,
)

_LIMITS = RlimitSettings(address_space_bytes=None, cpu_seconds=30)


def _errno_of(fn: Callable[[], object]) -> int | str:
    try:
        fn()
    except OSError as exc:
        return exc.errno or -1
    return "ok"


def _in_hardened_child(
    body: Callable[[HardeningReport], dict[str, object]],
    force: frozenset[str] = frozenset(),
    require: tuple[str, ...] = (),
    before: Callable[[], None] | None = None,
) -> dict[str, object]:
    plan = prepare_hardening(_LIMITS, _force_unavailable=force)
    canary = os.open(os.devnull, os.O_RDONLY)
    r, w = os.pipe()
    os.environ["SUAVE_CANARY"] = "1"
    pid = fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            os.close(r)
            out: dict[str, object]
            try:
                if before is not None:
                    before()
                report = apply_hardening(plan, keep_fds=[w], require=require)
                out = {"report": report.to_wire(), "canary": canary, **body(report)}
            except SuaveplanError as exc:
                out = {"error": exc.code, "details": dict(exc.details)}
            os.write(w, pickle.dumps(out))
        except BaseException:
            code = 1
        os._exit(code)
    os.close(w)
    os.close(canary)
    del os.environ["SUAVE_CANARY"]
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    result = pickle.loads(b"".join(chunks))
    assert isinstance(result, dict)
    return result


def _probes(_: HardeningReport) -> dict[str, object]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.getenv.restype = ctypes.c_char_p
    th_ran: list[int] = []
    t = threading.Thread(target=lambda: th_ran.append(1))
    t.start()
    t.join()
    return {
        "exec": _errno_of(lambda: os.execv("/bin/true", ["/bin/true"])),
        "fork": _errno_of(os.fork),
        "inet": _errno_of(lambda: socket.socket(socket.AF_INET)),
        "unix": _errno_of(lambda: socket.socket(socket.AF_UNIX)),
        "read": _errno_of(lambda: open("/etc/hostname").close()),
        "write": _errno_of(lambda: open("/tmp/suave-hardening-probe", "w").close()),
        "environ": dict(os.environ),
        "c_getenv": libc.getenv(b"SUAVE_CANARY"),
        "canary_open": _errno_of(lambda: os.fstat(_canary_fd[0])),
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
        "fsize": resource.getrlimit(resource.RLIMIT_FSIZE),
        "nproc": resource.getrlimit(resource.RLIMIT_NPROC),
        "core": resource.getrlimit(resource.RLIMIT_CORE),
        "cpu": resource.getrlimit(resource.RLIMIT_CPU),
        "cpu_used": resource.getrusage(resource.RUSAGE_SELF).ru_utime
        + resource.getrusage(resource.RUSAGE_SELF).ru_stime,
        "nnp": libc.prctl(39, 0, 0, 0, 0),
        "ptrace": libc.ptrace(16, os.getppid(), 0, 0) == -1 and ctypes.get_errno(),
        "thread": th_ran,
        "works": (json.dumps({"a": [1, 2]}), math.sqrt(16.0), len(bytearray(50_000_000))),
    }


_canary_fd = [-1]


@pytest.fixture(scope="module")
def hardened() -> dict[str, object]:
    _canary_fd[0] = os.open(os.devnull, os.O_RDONLY)
    try:
        return _in_hardened_child(_probes)
    finally:
        os.close(_canary_fd[0])


def test_every_layer_is_active_on_this_machine(hardened: dict[str, object]) -> None:
    report = HardeningReport.from_wire(hardened["report"])
    supported = {k for k, v in probe_hardening().items() if v == "ok"}
    assert set(report.active) == supported
    assert set(report.active) | set(report.missing) == set(LAYERS)


def test_exec_fork_and_sockets_are_denied_by_seccomp(hardened: dict[str, object]) -> None:
    assert hardened["exec"] == errno.EPERM
    assert hardened["fork"] == errno.EPERM
    assert hardened["inet"] == errno.EPERM
    assert hardened["unix"] == errno.EPERM
    assert hardened["ptrace"] == errno.EPERM


def test_filesystem_reads_and_writes_are_denied_by_landlock(hardened: dict[str, object]) -> None:
    assert hardened["read"] in (errno.EACCES, errno.EPERM)
    assert hardened["write"] in (errno.EACCES, errno.EPERM)


def test_environment_is_empty_in_python_and_c(hardened: dict[str, object]) -> None:
    assert hardened["environ"] == {}
    assert hardened["c_getenv"] is None


def test_unkept_fds_are_closed(hardened: dict[str, object]) -> None:
    assert hardened["canary_open"] == errno.EBADF


def test_rlimits_and_no_new_privs_read_back(hardened: dict[str, object]) -> None:
    assert hardened["nofile"] == (64, 64)
    assert hardened["fsize"] == (0, 0)
    # seccomp refuses new processes, so RLIMIT_NPROC is left as inherited (it would also
    # refuse threads to a non-root worker); see the fallback test below.
    assert hardened["nproc"] == resource.getrlimit(resource.RLIMIT_NPROC)
    assert hardened["core"] == (0, 0)
    # Per-call CPU backstop: soft = CPU used so far (rounded up) + 30 s, hard movable.
    cpu = hardened["cpu"]
    used = hardened["cpu_used"]
    assert isinstance(cpu, tuple) and isinstance(used, float)
    soft, hard = cpu
    assert hard == resource.RLIM_INFINITY
    assert 30 <= soft <= math.ceil(used) + 30
    assert hardened["nnp"] == 1


def test_without_seccomp_rlimit_nproc_zero_is_the_process_backstop() -> None:
    out = _in_hardened_child(
        lambda _: {
            "nproc": resource.getrlimit(resource.RLIMIT_NPROC),
            "fork": _errno_of(os.fork) if os.getuid() != 0 else "root-ignores-nproc",
        },
        force=frozenset({"seccomp"}),
    )
    assert out["nproc"] == (0, 0)
    assert "seccomp" in HardeningReport.from_wire(out["report"]).missing
    if os.getuid() != 0:
        assert out["fork"] == errno.EAGAIN


def _drop_to_nobody() -> None:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def test_threads_work_for_a_non_root_worker_under_seccomp() -> None:
    # RLIMIT_NPROC is enforced for non-root only: a worker running as `nobody` (dropped to
    # when this suite runs as root; otherwise it already is non-root) must still start
    # threads (seccomp, not NPROC, is what refuses processes) and still not fork.
    uid = 65534 if os.getuid() == 0 else os.getuid()

    def body(_: HardeningReport) -> dict[str, object]:
        ran: list[int] = []
        t = threading.Thread(target=lambda: ran.append(os.getuid()))
        t.start()
        t.join()
        return {"ran": ran, "fork": _errno_of(os.fork)}

    out = _in_hardened_child(body, before=_drop_to_nobody if os.getuid() == 0 else None)
    assert "seccomp" in HardeningReport.from_wire(out["report"]).active
    assert out["ran"] == [uid]
    assert out["fork"] == errno.EPERM


def test_cpu_backstop_seconds_follow_the_wall_clock_budget() -> None:
    assert cpu_backstop_seconds(None) is None
    assert cpu_backstop_seconds(1) == 2
    assert cpu_backstop_seconds(2000) == 3
    assert cpu_backstop_seconds(2500) == 4


def _cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _burn(seconds: float) -> None:
    start = _cpu_now()
    while _cpu_now() - start < seconds:
        sum(range(10_000))


def test_cpu_backstop_is_rearmed_per_call_and_kills_a_runaway_call() -> None:
    plan = prepare_hardening(RlimitSettings(address_space_bytes=None, cpu_seconds=1))
    r, w = os.pipe()
    pid = fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(r)
            apply_hardening(plan, keep_fds=[w])
            for _ in range(3):  # 3 x 0.6 s > 1 s in total, but each "call" re-arms
                arm_cpu_backstop()
                _burn(0.6)
            os.write(w, b"survived-calls\n")
            arm_cpu_backstop()
            _burn(30.0)  # a runaway call: SIGXCPU must end it after about 1-2 s of CPU
            os.write(w, b"not-killed\n")
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        said = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert said == b"survived-calls\n", status
    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGXCPU


def test_cpu_backstop_is_set_again_only_when_the_limit_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # In this process (no real limit is set): arming twice within the same CPU second sets
    # RLIMIT_CPU once; a second more of CPU moves the soft limit and sets it again.
    from suaveplan_sandbox.vm._hardening import _apply

    cpu, clock, reads = [41.2], [100.0], [0]
    set_to: list[tuple[int, tuple[int, int]]] = []

    def process_time() -> float:
        reads[0] += 1
        return cpu[0]

    monkeypatch.setattr(_apply, "_cpu_backstop", 3)
    monkeypatch.setattr(_apply, "_cpu_soft_limit", None)
    monkeypatch.setattr(_apply, "_cpu_unchanged_until", -math.inf)
    monkeypatch.setattr(time, "process_time", process_time)
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(resource, "setrlimit", lambda w, v: set_to.append((w, v)))
    inf = resource.RLIM_INFINITY
    arm_cpu_backstop()
    assert set_to == [(resource.RLIMIT_CPU, (45, inf))]
    # 0.7 s later the CPU cannot have passed 42 (one thread uses at most 0.7 s of it): the
    # CPU clock, a system call, is not even read.
    cpu[0], clock[0] = 41.9, 100.7
    arm_cpu_backstop()
    assert (reads[0], len(set_to)) == (1, 1)
    # 0.9 s later it may have: read, and the limit moved with the second passed.
    cpu[0], clock[0] = 42.1, 100.9
    arm_cpu_backstop()
    assert reads[0] == 2
    assert set_to[1:] == [(resource.RLIMIT_CPU, (46, inf))]
    # Read again but still within second 43: nothing is set.
    cpu[0], clock[0] = 42.95, 101.85
    arm_cpu_backstop()
    assert (reads[0], len(set_to)) == (3, 2)


def test_threads_still_work_and_interpreter_is_usable(hardened: dict[str, object]) -> None:
    # Root ignores RLIMIT_NPROC; seccomp allows clone with CLONE_THREAD.
    assert hardened["thread"] == [1]
    assert hardened["works"] == ('{"a": [1, 2]}', 4.0, 50_000_000)


def test_missing_optional_layer_is_reported() -> None:
    out = _in_hardened_child(lambda _: {}, force=frozenset({"landlock_fs"}))
    report = HardeningReport.from_wire(out["report"])
    assert "landlock_fs" in report.missing
    assert "landlock_fs" not in report.active
    assert "seccomp" in report.active


def test_missing_required_layer_fails_closed() -> None:
    out = _in_hardened_child(lambda _: {}, force=frozenset({"seccomp"}), require=("seccomp",))
    assert out["error"] == "SAND_VM_HARDENING_UNAVAILABLE"
    assert out["details"]["layer"] == "seccomp"  # type: ignore[index]


def test_report_wire_round_trip_and_validation() -> None:
    report = HardeningReport(active=("fds",), missing={"seccomp": "x"}, landlock_abi=7)
    assert HardeningReport.from_wire(report.to_wire()) == report
    with pytest.raises(ValueError):
        HardeningReport.from_wire({"active": ["bogus"], "missing": {}, "landlock_abi": None})
    with pytest.raises(ValueError):
        HardeningReport.from_wire([])


def _raw_syscall_errno(nr: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(nr), ctypes.c_long(0), ctypes.c_long(0))
    return ctypes.get_errno() if rc == -1 else 0


def test_x32_syscalls_are_denied_and_clone3_reports_enosys() -> None:
    out = _in_hardened_child(
        lambda _: {"x32": _raw_syscall_errno(0x40000000 | 39), "clone3": _raw_syscall_errno(435)}
    )
    assert out["x32"] == errno.EPERM
    assert out["clone3"] == errno.ENOSYS


def _landlock_only_probes(_: HardeningReport) -> dict[str, object]:
    s = socket.socket(socket.AF_INET)
    try:
        connect = _errno_of(lambda: s.connect(("127.0.0.1", 9)))
        bind = _errno_of(lambda: s.bind(("127.0.0.1", 0)))
    finally:
        s.close()
    return {"connect": connect, "bind": bind, "signal": _errno_of(lambda: os.kill(os.getppid(), 0))}


def test_landlock_denies_tcp_and_signals_even_without_seccomp() -> None:
    out = _in_hardened_child(_landlock_only_probes, force=frozenset({"seccomp"}))
    report = HardeningReport.from_wire(out["report"])
    abi = report.landlock_abi
    if abi is None or abi < 4:
        assert "landlock_net" in report.missing
    else:
        assert "landlock_net" in report.active
        assert out["connect"] == errno.EACCES
        assert out["bind"] == errno.EACCES
    if abi is not None and abi >= 6:
        assert out["signal"] == errno.EPERM


def test_forcing_landlock_net_off_leaves_tcp_to_the_kernel() -> None:
    out = _in_hardened_child(_landlock_only_probes, force=frozenset({"seccomp", "landlock_net"}))
    report = HardeningReport.from_wire(out["report"])
    assert "landlock_net" in report.missing
    assert out["connect"] == errno.ECONNREFUSED  # nothing listens on port 9; not EACCES
