"""The seccomp allow list, from the attacker's side and against its survey.

An escaped plugin (run without the in-interpreter layer, the test-only switch the escape
corpus uses) makes raw `syscall()`s through ctypes inside a real worker forked from the fork
server: calls the old deny list let through must now be refused. And the survey the allow
list was drawn from (`scripts/seccomp_survey.py`) must agree with the table in the code.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sys
from pathlib import Path

import pytest

from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import _sandbox as vm_sandbox_module
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._guest import PluginBundle, load_plugin
from suaveplan_sandbox.vm._hardening import _apply as A

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.uname().machine != "x86_64",
    reason="the seccomp filter is x86_64 Linux only",
)

SURVEY = Path(__file__).with_name("seccomp_survey.json")

RAW_SYSCALLS = """
import ctypes


def raw(calls):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    out = {}
    for name, nr, args in calls:
        ctypes.set_errno(0)
        rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
        out[name] = ctypes.get_errno() if rc == -1 else "ok"
    return out
"""

# Let through by the old deny list, refused by the allow list (x86_64 numbers and harmless
# arguments: each would fail or do nothing much if it were reached, so a regression shows
# as a different errno, not as damage).
_NEWLY_REFUSED = {
    "memfd_secret": (447, 0),
    "memfd_create": (319, 0, 0),
    "pidfd_open": (434, 1, 0),  # a handle on init
    "io_setup": (206, 1, 0),  # AIO: EFAULT when reached
    "vmsplice": (278, -1, 0, 0, 0),
    "splice": (275, -1, 0, -1, 0, 1, 0),
    "openat": (257, -100, 0, 0),  # a NULL path: EFAULT when reached
    "mbind": (237, 0, 0, 0, 0, 0, 0),
    "seccomp": (317, 0, 0, 0),
    "landlock_create_ruleset": (444, 0, 0, 1),
    "lookup_dcookie": (212, 0, 0, 0),
    "uname": (63, 0),  # the host's kernel release: EFAULT when reached
    "arch_prctl": (158, 0x1003, 0),
    "prctl_set_dumpable": (157, 4, 1),
    "ioctl_siocgifconf": (16, 0, 0x8912, 0),  # the host's network interfaces
}

# Allowed, as controls: the same route reaches the kernel for these.
_STILL_ALLOWED = {
    "getpid": (39,),
    "prctl_get_no_new_privs": (157, 39, 0, 0, 0, 0),
    "fionread_bad_fd": (16, -1, 0x541B, 0),  # EBADF from the kernel, not the filter
}


def _unchecked(path: str | os.PathLike[str]) -> PluginBundle:
    return load_plugin(path, _without_interpreter_layer=True)


def test_an_escaped_plugin_is_refused_what_the_deny_list_let_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "raw.py").write_text(RAW_SYSCALLS)
    policy = PermissionPolicy.from_manifest(
        {"name": "raw", "permissions": {"fs": ["./data/*"]}}, root=tmp_path
    )
    calls = [
        [name, call[0], list(call[1:])]
        for name, call in {**_NEWLY_REFUSED, **_STILL_ALLOWED}.items()
    ]

    async def main() -> tuple[object, tuple[str, ...]]:
        with monkeypatch.context() as patch:
            patch.setattr(vm_sandbox_module, "load_plugin", _unchecked)
            sb = await create_vm_sandbox(plugin_module_path=tmp_path / "raw.py", policy=policy)
        async with sb:
            return await sb.call("raw", calls), sb.hardening.active

    out, active = asyncio.run(main())
    assert "seccomp" in active
    assert isinstance(out, dict)
    for name in _NEWLY_REFUSED:
        assert out[name] == errno.EPERM, (name, out)
    assert out["getpid"] == "ok"
    assert out["prctl_get_no_new_privs"] == "ok"
    assert out["fionread_bad_fd"] == errno.EBADF


# Survey rows a worker made that the allow list refuses on purpose, and why.
_REFUSED_ON_PURPOSE = {
    "openat": "failed opens only (Landlock answered EACCES): late imports, red-team probes",
    "memfd_create": "red-team probe (fexecve of a memfd)",
    "pidfd_open": "red-team probes (pidfd_send_signal to the host)",
}


def _surveys() -> dict[str, dict[str, dict[str, object]]]:
    """Survey runs by interpreter: under the allow list (`pythons`) and, from before it,
    under the deny list (`before`), where nothing but the deny list's own entries was
    refused, so its rows show everything the suites made a worker try."""
    report = json.loads(SURVEY.read_text())
    assert isinstance(report, dict)
    return {"allow list": report["pythons"], "deny list": report["before"]["pythons"]}


def test_survey_covers_three_pythons_and_every_call_it_saw_succeed_is_allowed() -> None:
    surveys = _surveys()
    versions = {str(entry["python"])[:4] for entry in surveys["allow list"].values()}
    assert versions >= {"3.11", "3.12", "3.13"}
    for filter_name, pythons in surveys.items():
        for label, entry in pythons.items():
            worker = entry["worker"]
            assert isinstance(worker, dict)
            assert {"mmap", "recvfrom", "sendto", "getrandom"} <= set(worker), label
            for name, row in worker.items():
                # A call the kernel carried out (ok), or failed for a reason of its own
                # (EBADF, EAGAIN, ENOMEM...), is a use some code made: it must be on the allow
                # list or refused on purpose, with the reason. Rows that only ever got the
                # filter's refusal are red-team probes.
                if name.startswith("syscall_0x"):
                    continue  # a number outside strace's table: the ENOSYS/EPERM rules
                if set(row["results"]) <= {"EPERM", "ENOSYS"} or name in _REFUSED_ON_PURPOSE:
                    continue
                assert name in A._ALLOWED_SYSCALLS, (filter_name, label, name, row)


def test_refused_on_purpose_is_really_refused() -> None:
    for name in _REFUSED_ON_PURPOSE:
        assert name not in A._ALLOWED_SYSCALLS
