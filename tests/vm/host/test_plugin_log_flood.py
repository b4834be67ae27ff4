"""A plugin that prints without end costs the host bounded memory and a bounded log volume.

`VmSandbox.logs` keeps the most recent lines (bounded in lines and characters) and
`logs_total` counts them all; what reaches the host's `logging` is rate-limited per sandbox,
each line cut and its control characters escaped, and the lines held back are reported in
one warning carrying their count.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import LOG_LINES_SUPPRESSED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import FakeClock
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox
from suaveplan_sandbox.vm._sandbox import (
    MAX_FORWARDED_LOG_CHARS,
    MAX_RECORDED_LOG_CHARS,
    MAX_RECORDED_LOGS,
)

SOURCE = """
from suaveplan import log


def shout(n, width=1):
    for i in range(n):
        print(str(i).rjust(width, "x"))


def say(text):
    print(text)


def warn(text):
    log.warning(text)
"""

LOGGER = "suaveplan_sandbox.vm"


async def _sandbox(tmp: Path, **kwargs: object) -> VmSandbox:
    (tmp / "p.py").write_text(SOURCE)
    policy = PermissionPolicy.from_manifest({"name": "loud"}, root=tmp)
    return await create_vm_sandbox(
        plugin_module_path=tmp / "p.py",
        policy=policy,
        **kwargs,  # type: ignore[arg-type]
    )


def _plugin_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == LOGGER and r.getMessage().startswith("[loud] ") and not _is_summary(r)
    ]


def _is_summary(record: logging.LogRecord) -> bool:
    return "suppressed_lines" in getattr(record, "suaveplan", {})


def _suppressed(caplog: pytest.LogCaptureFixture) -> int:
    return sum(r.suaveplan["suppressed_lines"] for r in caplog.records if _is_summary(r))  # type: ignore[attr-defined]


async def test_a_plugin_printing_without_end_keeps_only_the_most_recent_lines(
    tmp_path: Path,
) -> None:
    n = MAX_RECORDED_LOGS + 300
    async with await _sandbox(tmp_path) as sb:
        await sb.call("shout", n)
        logs = sb.logs
        assert sb.logs_total == n
        assert len(logs) == MAX_RECORDED_LOGS
        # The most recent, oldest first.
        assert logs[0] == ("info", str(n - MAX_RECORDED_LOGS))
        assert logs[-1] == ("info", str(n - 1))
        logs.clear()  # a copy: the sandbox's record is untouched
        assert len(sb.logs) == MAX_RECORDED_LOGS


async def test_the_recorded_logs_are_bounded_in_characters_as_well_as_lines(
    tmp_path: Path,
) -> None:
    width = 65_000
    n = MAX_RECORDED_LOG_CHARS // width + 10
    async with await _sandbox(tmp_path) as sb:
        await sb.call("shout", n, width)
        logs = sb.logs
        assert sb.logs_total == n
        assert sum(len(text) for _, text in logs) <= MAX_RECORDED_LOG_CHARS
        assert len(logs) == MAX_RECORDED_LOG_CHARS // width
        assert logs[-1] == ("info", str(n - 1).rjust(width, "x"))


async def test_lines_reaching_the_host_logging_are_rate_limited_and_the_rest_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()  # still: the rate limiter gets no new allowance until advanced
    metrics = InMemoryMetrics()
    async with await _sandbox(tmp_path, clock=clock, log_lines_per_s=10, metrics=metrics) as sb:
        await sb.call("shout", 50)
        assert [r.getMessage() for r in _plugin_lines(caplog)] == [f"[loud] {i}" for i in range(10)]
        assert sb.logs_total == 50
        assert sb.logs_suppressed == 40
        assert metrics.value(LOG_LINES_SUPPRESSED.name, plugin="loud") == 40
        assert len(sb.logs) == 50  # the record keeps what the log pipeline was spared
        clock.advance(1.0)
        await sb.call("say", "after")
        # One warning with the count, then the line itself.
        assert _suppressed(caplog) == 40
        assert _plugin_lines(caplog)[-1].getMessage() == "[loud] after"
        summaries = [r for r in caplog.records if _is_summary(r)]
        assert len(summaries) == 1
        assert summaries[0].levelno == logging.WARNING
        assert summaries[0].suaveplan["plugin"] == "loud"  # type: ignore[attr-defined]


async def test_lines_held_back_when_the_sandbox_is_disposed_are_still_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()
    async with await _sandbox(tmp_path, clock=clock, log_lines_per_s=5) as sb:
        await sb.call("shout", 12)
        assert len(_plugin_lines(caplog)) == 5
        assert _suppressed(caplog) == 0
    assert _suppressed(caplog) == 7


async def test_a_plugin_flooding_across_many_calls_reaches_the_host_log_at_the_rate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()
    async with await _sandbox(tmp_path, clock=clock, log_lines_per_s=4) as sb:
        for _ in range(20):
            await sb.call("shout", 10)
        assert len(_plugin_lines(caplog)) == 4
        # Each call's end does not add a warning of its own when the rate is spent.
        assert [r for r in caplog.records if _is_summary(r)] == []
        assert sb.logs_suppressed == 196
    assert _suppressed(caplog) == 196


async def test_a_log_line_cannot_forge_host_log_lines_or_terminal_escapes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    forged = "ok\nCRITICAL suaveplan_sandbox.gateway: all secrets rotated\r\x1b[2J\u202edone"
    async with await _sandbox(tmp_path) as sb:
        await sb.call("say", forged)
        await sb.call("warn", "a\u2028b")
        messages = [r.getMessage() for r in _plugin_lines(caplog)]
        assert messages == [
            "[loud] ok\\nCRITICAL suaveplan_sandbox.gateway: all secrets rotated\\r\\x1b[2J"
            "\\u202edone",
            "[loud] a\\u2028b",
        ]
        assert all(m.isprintable() for m in messages)
        # The record for the host program keeps the text as the plugin wrote it.
        assert sb.logs == [("info", forged), ("warning", "a\u2028b")]


async def test_a_long_line_reaches_the_host_logging_cut_with_its_length(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with await _sandbox(tmp_path) as sb:
        await sb.call("say", "y" * 65_000)
        (record,) = _plugin_lines(caplog)
        message = record.getMessage()
        assert message.startswith("[loud] " + "y" * MAX_FORWARDED_LOG_CHARS)
        assert len(message) < MAX_FORWARDED_LOG_CHARS + 100
        assert message.endswith("[65000 characters]")
        assert sb.logs == [("info", "y" * 65_000)]


async def test_no_rate_limit_forwards_every_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with await _sandbox(tmp_path, clock=FakeClock(), log_lines_per_s=None) as sb:
        await sb.call("shout", 500)
        assert len(_plugin_lines(caplog)) == 500
        assert sb.logs_suppressed == 0


async def test_a_rate_of_zero_forwards_nothing_but_still_records_and_reports(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with await _sandbox(tmp_path, log_lines_per_s=0) as sb:
        await sb.call("shout", 3)
        assert _plugin_lines(caplog) == []
        assert len(sb.logs) == 3
    assert _suppressed(caplog) == 3


async def test_lines_below_the_host_loggers_level_cost_no_allowance(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with await _sandbox(tmp_path, clock=FakeClock(), log_lines_per_s=2) as sb:
        await sb.call("shout", 30)  # info: the host does not log it at all
        await sb.call("warn", "w1")
        await sb.call("warn", "w2")
        assert [r.getMessage() for r in _plugin_lines(caplog)] == ["[loud] w1", "[loud] w2"]
        assert sb.logs_suppressed == 0


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True, float("nan")])
async def test_an_invalid_log_rate_is_refused(tmp_path: Path, bad: object) -> None:
    with pytest.raises(SuaveplanError) as info:
        await _sandbox(tmp_path, log_lines_per_s=bad)
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details["argument"] == "log_lines_per_s"
