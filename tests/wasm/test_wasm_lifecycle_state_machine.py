"""The WASM sandbox lifecycle as a state machine against a model of the guest's state.

Model: `ready`, `ended` or `disposed`, plus the guest's one mutable global (a counter), so the model
can tell that calls really run in the same instance and in order. Rules drive a real
`WasmSandbox` on a private event loop: arithmetic calls, counter bumps (alone and
concurrently — calls are serialised, so concurrent bumps return a permutation of the next
counter values), traps, unknown exports, wrong arity and ill-typed arguments, a wall-clock
breach, `run` of a module with no `_start`, and (double) dispose. The lifecycle table in
`wasm/_sandbox.py` is the model: a call, a trap or a refused argument leaves the instance
ready; a budget breach ends it (every later call and run is `SAND_WASM_ENDED`); after
dispose every call and run is `SAND_WASM_DISPOSED`.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Final, TypeVar

import wasmtime
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import WasmSandbox, create_wasm_sandbox

_T = TypeVar("_T")

GUEST: Final = """
(module
  (memory (export "memory") 1)
  (global $n (mut i32) (i32.const 0))
  (func (export "add") (param i32 i32) (result i32)
    (i32.add (local.get 0) (local.get 1)))
  (func (export "bump") (result i32)
    (global.set $n (i32.add (global.get $n) (i32.const 1)))
    (global.get $n))
  (func (export "bump_then_trap")
    (global.set $n (i32.add (global.get $n) (i32.const 1)))
    unreachable)
  (func (export "spin") (loop $l (br $l))))
"""
WALL_CLOCK_MS: Final = 300

_DIR = tempfile.TemporaryDirectory(prefix="wasm-state-machine-")
_ROOT = Path(_DIR.name)
_MODULE = _ROOT / "guest.wasm"
_MODULE.write_bytes(wasmtime.wat2wasm(GUEST))
_POLICY = PermissionPolicy.from_manifest(
    {"name": "lifecycle", "permissions": {"budgets": {"wallClockMs": WALL_CLOCK_MS}}},
    root=_ROOT,
)

i32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
# Unsigned readings of i32 are accepted too (same bits).
i32_any = st.integers(min_value=-(2**31), max_value=2**32 - 1)
not_i32 = st.one_of(
    st.integers(min_value=2**32),
    st.integers(max_value=-(2**31) - 1),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)


def _wrap(value: int) -> int:
    """i32 arithmetic as the guest does it, read back as a signed result."""
    value &= 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


class WasmLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.sb: WasmSandbox | None = None
        self.model = "ready"
        self.counter = 0

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self.loop.run_until_complete(coro)

    @property
    def sandbox(self) -> WasmSandbox:
        assert self.sb is not None
        return self.sb

    def outcome(self, export: str, *args: Any) -> tuple[object, SuaveplanError | None]:
        try:
            return self.run(self.sandbox.call(export, *args)), None
        except SuaveplanError as exc:
            return None, exc

    def expect_code(self, err: SuaveplanError | None, code: str) -> SuaveplanError:
        if self.model == "disposed":
            code = "SAND_WASM_DISPOSED"
        elif self.model == "ended":
            code = "SAND_WASM_ENDED"
        assert err is not None, f"expected {code}"
        assert err.code == code, (err.code, err.details)
        return err

    @initialize()
    def create(self) -> None:
        self.sb = self.run(create_wasm_sandbox(wasm_module_path=_MODULE, policy=_POLICY))

    @rule(a=i32_any, b=i32_any)
    def add(self, a: int, b: int) -> None:
        got, err = self.outcome("add", a, b)
        if self.model == "ready":
            assert err is None and got == _wrap(a + b)
        else:
            self.expect_code(err, "SAND_WASM_DISPOSED")

    @rule(bad=not_i32, first=st.booleans())
    def ill_typed_argument(self, bad: object, first: bool) -> None:
        args: tuple[Any, ...] = (bad, 1) if first else (1, bad)
        _, err = self.outcome("add", *args)
        checked = self.expect_code(err, "SAND_INVALID_ARGUMENT")
        if self.model == "ready":
            assert checked.details["index"] == (0 if first else 1)

    @rule()
    def bump(self) -> None:
        got, err = self.outcome("bump")
        if self.model == "ready":
            self.counter += 1
            assert err is None and got == _wrap(self.counter), (got, self.counter)
        else:
            self.expect_code(err, "SAND_WASM_DISPOSED")

    @rule(count=st.integers(min_value=2, max_value=5))
    def concurrent_bumps(self, count: int) -> None:
        async def together() -> list[object]:
            calls = [self.sandbox.call("bump") for _ in range(count)]
            return list(await asyncio.gather(*calls, return_exceptions=True))

        results = self.run(together())
        if self.model == "ready":
            expected = [_wrap(self.counter + i) for i in range(1, count + 1)]
            assert sorted(results) == expected, "calls are serialised, none lost or doubled"  # type: ignore[type-var]
            self.counter += count
        else:
            for result in results:
                assert isinstance(result, SuaveplanError)
                self.expect_code(result, "SAND_WASM_DISPOSED")

    @rule()
    def trap(self) -> None:
        _, err = self.outcome("bump_then_trap")
        self.expect_code(err, "SAND_WASM_TRAP")
        if self.model == "ready":
            self.counter += 1  # what ran before the trap stays done

    @rule(export=st.sampled_from(["nope", "memory", "", "_start"]))
    def unknown_export(self, export: str) -> None:
        _, err = self.outcome(export)
        self.expect_code(err, "SAND_WASM_NO_SUCH_EXPORT")

    @rule(args=st.lists(i32, max_size=3).filter(lambda a: len(a) != 2))
    def wrong_arity(self, args: list[int]) -> None:
        _, err = self.outcome("add", *args)
        checked = self.expect_code(err, "SAND_INVALID_ARGUMENT")
        if self.model == "ready":
            assert checked.details["expected"] == 2 and checked.details["got"] == len(args)

    @rule()
    def breach_the_wall_clock(self) -> None:
        _, err = self.outcome("spin")
        checked = self.expect_code(err, "BUDGET_EXCEEDED")
        if self.model == "ready":
            assert checked.details["budget"] == "wallClockMs"
            self.model = "ended"
        elif self.model == "ended":
            assert checked.details["budget"] == "wallClockMs"  # the breach that ended it
            assert isinstance(checked.cause, SuaveplanError)
            assert checked.cause.code == "BUDGET_EXCEEDED"

    @rule()
    def run_without_start(self) -> None:
        try:
            self.run(self.sandbox.run(argv=["guest"]))
        except SuaveplanError as exc:
            self.expect_code(exc, "SAND_WASM_NO_SUCH_EXPORT")
        else:
            raise AssertionError("a module without _start ran")

    @rule(nowait=st.booleans())
    def dispose(self, nowait: bool) -> None:
        if nowait:
            self.sandbox.dispose_nowait()
        else:
            self.run(self.sandbox.dispose())
        self.model = "disposed"

    @invariant()
    def handle_agrees_with_the_model(self) -> None:
        if self.sb is not None:
            assert self.sb.disposed == (self.model == "disposed")
            assert self.sb.state == self.model

    def teardown(self) -> None:
        try:
            if self.sb is not None:
                self.run(self.sb.dispose())
                self.run(self.sb.dispose())
                assert self.sb.disposed
        finally:
            self.loop.close()


WasmLifecycle.TestCase.settings = settings(
    max_examples=15,
    stateful_step_count=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_wasm_lifecycle_state_machine = WasmLifecycle.TestCase
