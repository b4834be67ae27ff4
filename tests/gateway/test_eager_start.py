"""`start_eagerly`: a coroutine's first step runs at once, inside the task that owns it, on
Python 3.11 as on 3.12 and later."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
from typing import Any

import pytest

from suaveplan_sandbox.gateway._eager import Finished, start_eagerly

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("_VAR", default="unset")


async def test_a_coroutine_that_does_not_suspend_is_finished_at_once_in_its_own_task() -> None:
    outer = asyncio.current_task()
    seen: list[asyncio.Task[object] | None] = []

    async def quick() -> str:
        seen.append(asyncio.current_task())
        return "done"

    started = start_eagerly(quick())
    assert started == Finished("done", None)
    assert started.result() == "done"
    (inner,) = seen
    assert isinstance(inner, asyncio.Task) and inner is not outer
    assert asyncio.current_task() is outer  # the caller's task is current again


async def test_an_error_in_the_first_step_is_handed_back_and_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails() -> None:
        raise ValueError("boom")

    started = start_eagerly(fails())
    assert isinstance(started, Finished)
    with pytest.raises(ValueError, match="boom"):
        started.result()
    for _ in range(3):  # let the task's own first step run, then collect it
        await asyncio.sleep(0)
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_a_suspended_coroutine_continues_in_the_task_that_ran_its_first_step() -> None:
    tasks: list[asyncio.Task[object] | None] = []

    async def slow() -> tuple[str, str]:
        _VAR.set("inside")
        tasks.append(asyncio.current_task())
        await asyncio.sleep(0.01)
        tasks.append(asyncio.current_task())
        return _VAR.get(), "late"

    started = start_eagerly(slow())
    assert isinstance(started, asyncio.Task)
    assert len(tasks) == 1  # the first step ran already
    assert await started == ("inside", "late")  # the same context throughout
    assert tasks == [started, started]
    assert _VAR.get() == "unset"  # and nothing leaked into the caller's


async def test_asyncio_timeout_in_the_first_step_cancels_the_right_task() -> None:
    # `asyncio.timeout` keeps the task current at its entry and cancels that one later: if
    # the first step had run as the caller's task, the caller would be cancelled instead.
    async def bounded() -> str:
        try:
            async with asyncio.timeout(0.02):
                await asyncio.sleep(5)
        except TimeoutError:
            return "timed out"
        return "slept"

    started = start_eagerly(bounded())
    assert isinstance(started, asyncio.Task)
    assert await asyncio.wait_for(started, 5) == "timed out"


@pytest.mark.parametrize("before_first_task_step", [True, False])
async def test_cancelling_reaches_the_coroutine_where_it_waits(
    before_first_task_step: bool,
) -> None:
    events: list[str] = []

    async def waits() -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            events.append("cancelled at its await")
            raise

    started = start_eagerly(waits())
    assert isinstance(started, asyncio.Task)
    if not before_first_task_step:
        await asyncio.sleep(0)  # the task has taken over the wait
    started.cancel()
    with pytest.raises(asyncio.CancelledError):
        await started
    assert events == ["cancelled at its await"]
    assert started.cancelled()


async def test_started_from_a_loop_callback_with_no_current_task() -> None:
    loop = asyncio.get_running_loop()
    result: asyncio.Future[tuple[object, bool]] = loop.create_future()

    async def quick() -> bool:
        return asyncio.current_task() is not None

    def callback() -> None:
        started = start_eagerly(quick())
        result.set_result((started, asyncio.current_task() is None))

    loop.call_soon(callback)
    started, none_after = await result
    assert started == Finished(True, None)
    assert none_after


async def test_the_tasks_left_behind_end_quietly(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncio")

    async def quick() -> int:
        return 1

    before = len(asyncio.all_tasks())
    for _ in range(50):
        assert start_eagerly(quick()) == Finished(1, None)
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_loop_with_an_old_style_task_factory_still_gets_its_answer() -> None:
    # A factory written before `context=` existed: on 3.11 the request must not fail on it.
    loop = asyncio.get_running_loop()
    made: list[object] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[Any]:
        made.append(coro)
        return asyncio.Task(coro, loop=loop)

    async def quick() -> str:
        return "done"

    loop.set_task_factory(factory)
    try:
        started = start_eagerly(quick())
        value = await started if isinstance(started, asyncio.Task) else started.result()
    finally:
        loop.set_task_factory(None)
    assert value == "done"
