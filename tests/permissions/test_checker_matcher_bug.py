"""A matcher that crashes is a denial, and its log line carries no guest data."""

from __future__ import annotations

import logging

import pytest

from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy

SECRET = "s3cr3t-token-value"


def _crashing(*args: object) -> object:
    raise ValueError(f"cannot match {args!r}")  # the guest's input, secret and all


@pytest.mark.parametrize(
    ("capability", "call"),
    [
        ("fs", lambda c: c.check_fs(f"./data/{SECRET}")),
        ("fetch", lambda c: c.check_fetch(f"https://api.example.com/?t={SECRET}")),
        ("connect", lambda c: c.check_connect(f"{SECRET}.example.com", 443)),
        ("db", lambda c: c.check_capability("db", {"sql": f"SELECT '{SECRET}'"})),
    ],
)
def test_a_crashing_matcher_denies_and_logs_only_its_type_and_place(
    capability: str, call: object, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = PermissionPolicy.from_manifest(
        {
            "name": "p",
            "permissions": {"fs": ["./data/*"], "fetch": ["api.example.com"]},
            "database": {"tablePrefix": "p_"},
        },
        root="/tmp",
    )
    checker = PermissionChecker(policy)
    monkeypatch.setattr(checker, "_fs_check", _crashing)
    monkeypatch.setattr(checker, "_fetch_check", _crashing)
    monkeypatch.setattr(type(policy.fetch), "check_host", _crashing)
    if capability == "db":
        monkeypatch.setattr(PermissionChecker, "_dispatch", _crashing)
    with caplog.at_level(logging.DEBUG, logger="suaveplan_sandbox"):
        decision = call(checker)  # type: ignore[operator]
    assert type(decision).__name__ == "Deny"
    [record] = [r for r in caplog.records if r.name == "suaveplan_sandbox.permissions"]
    text = record.getMessage()
    assert "ValueError" in text and "_crashing" in text
    assert SECRET not in text
    assert record.exc_info is None and record.exc_text is None
