"""The VM sandbox lifecycle as a state machine against a three-state model.

Model: `idle` (serving), `crashed` (the worker is gone: killed, or ended by a budget breach)
and `disposed`. Rules drive a real `VmSandbox` on a private event loop: single and
concurrent calls, plugin errors, unknown functions, unencodable arguments, SIGKILL of the
worker, a wall-clock breach, and (double) dispose. Every outcome is checked against what the
model predicts — a value, or one specific coded error — and the handle's `state` must agree
with the model after every step.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Final, TypeVar

import psutil
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox

_T = TypeVar("_T")

PLUGIN: Final = """
def echo(x):
    return x

def boom(kind):
    raise ValueError(kind)

def spin():
    while True:
        pass
"""
# Generous: an echo must never breach it on a loaded machine; a spin always does.
WALL_CLOCK_MS: Final = 1000

_DIR = tempfile.TemporaryDirectory(prefix="vm-state-machine-")
_ROOT = Path(_DIR.name)
(_ROOT / "plugin.py").write_text(PLUGIN, encoding="utf-8")
_POLICY = PermissionPolicy.from_manifest(
    {"name": "lifecycle", "permissions": {"budgets": {"wallClockMs": WALL_CLOCK_MS}}},
    root=_ROOT,
)

plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=10)
    | st.binary(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


class VmLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.sb: VmSandbox | None = None
        self.model = "idle"
        # After a SIGKILL the host learns of the death only when it next touches the channel.
        self.kill_unobserved = False
        self.pids: list[int] = []

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self.loop.run_until_complete(coro)

    @property
    def sandbox(self) -> VmSandbox:
        assert self.sb is not None
        return self.sb

    def expected_error(self) -> str | None:
        if self.model == "disposed":
            return "SAND_VM_DISPOSED"
        if self.model == "crashed":
            return "SAND_VM_WORKER_CRASHED"
        return None

    def call(self, name: str, *args: object) -> tuple[object, SuaveplanError | None]:
        try:
            return self.run(self.sandbox.call(name, *args)), None
        except SuaveplanError as exc:
            return None, exc

    def check_refused(self, err: SuaveplanError | None, code: str) -> None:
        assert err is not None, f"expected {code}"
        assert err.code == code, (err.code, err.details)
        self.kill_unobserved = False

    @initialize()
    def create(self) -> None:
        self.sb = self.run(
            create_vm_sandbox(plugin_module_path=_ROOT / "plugin.py", policy=_POLICY)
        )
        self.pids.append(self.sb.pid)
        assert self.sb.state == "idle"

    @rule(value=plain)
    def call_echo(self, value: object) -> None:
        got, err = self.call("echo", value)
        code = self.expected_error()
        if code is None:
            assert err is None, (err.code, err.details) if err else None
            assert got == value
        else:
            self.check_refused(err, code)

    @rule(values=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=2, max_size=5))
    def concurrent_calls(self, values: list[int]) -> None:
        async def together() -> list[object]:
            calls = (self.sandbox.call("echo", v) for v in values)
            return await asyncio.gather(*calls, return_exceptions=True)

        results = self.run(together())
        code = self.expected_error()
        if code is None:
            assert results == values, "each concurrent call gets its own answer"
        else:
            for result in results:
                assert isinstance(result, SuaveplanError)
                self.check_refused(result, code)

    @rule(kind=st.text(max_size=10))
    def plugin_raises(self, kind: str) -> None:
        _, err = self.call("boom", kind)
        code = self.expected_error() or "SAND_VM_PLUGIN_ERROR"
        self.check_refused(err, code)
        if code == "SAND_VM_PLUGIN_ERROR":
            assert err is not None and err.details["type"] == "ValueError"

    @rule(name=st.sampled_from(["nope", "_private", "PLUGIN", "echo2"]))
    def call_unknown_function(self, name: str) -> None:
        _, err = self.call(name)
        self.check_refused(err, self.expected_error() or "SAND_VM_NO_SUCH_FUNCTION")

    @rule()
    def call_with_an_unencodable_argument(self) -> None:
        _, err = self.call("echo", object())
        # Refused on the host before anything is written: the worker is unaffected, and a
        # kill the host has not noticed yet stays unnoticed.
        if self.kill_unobserved and err is not None and err.code == "SAND_INVALID_ARGUMENT":
            return
        self.check_refused(err, self.expected_error() or "SAND_INVALID_ARGUMENT")

    @rule()
    def kill_worker(self) -> None:
        if self.model != "idle":
            return
        os.kill(self.sandbox.pid, signal.SIGKILL)
        self.model = "crashed"
        self.kill_unobserved = True

    @rule()
    def breach_the_wall_clock(self) -> None:
        _, err = self.call("spin")
        code = self.expected_error()
        if code is None:
            self.check_refused(err, "BUDGET_EXCEEDED")
            assert err is not None and err.details["budget"] == "wallClockMs"
            self.model = "crashed"  # a breach ends the guest
        else:
            self.check_refused(err, code)

    @rule()
    def dispose(self) -> None:
        self.run(self.sandbox.dispose())
        self.model = "disposed"
        self.kill_unobserved = False

    @invariant()
    def handle_state_agrees_with_the_model(self) -> None:
        if self.sb is None:
            return
        allowed = {"idle", "crashed"} if self.kill_unobserved else {self.model}
        assert self.sb.state in allowed, (self.sb.state, self.model)

    def teardown(self) -> None:
        try:
            if self.sb is not None:
                self.run(self.sb.dispose())
                assert self.sb.state == "disposed"
        finally:
            self.loop.close()
        for pid in self.pids:
            _assert_gone(pid)


def _assert_gone(pid: int) -> None:
    """The worker is dead (or a zombie its fork server has yet to reap) soon after dispose."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)
    raise AssertionError(f"worker {pid} still running after dispose")


VmLifecycle.TestCase.settings = settings(
    max_examples=12,
    stateful_step_count=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_vm_lifecycle_state_machine = VmLifecycle.TestCase
