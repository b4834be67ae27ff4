"""PermissionChecker: capability gating, one metric per Deny, never an unexpected exception."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import PERMISSION_DENIED, InMemoryMetrics
from suaveplan_sandbox.permissions import Allow, Deny, PermissionChecker, PermissionPolicy

MANIFEST: dict[str, Any] = {
    "name": "invoices",
    "permissions": {"fs": ["./uploads/*", "rw:./out/*"], "fetch": ["api.stripe.com"]},
    "database": {"tablePrefix": "billing_"},
    "secrets": [{"name": "STRIPE_SECRET_KEY"}],
    "events": {"publishes": ["invoice.created"], "subscribes": ["payment.*"]},
}


@pytest.fixture
def metrics() -> InMemoryMetrics:
    return InMemoryMetrics()


@pytest.fixture
def checker(metrics: InMemoryMetrics) -> PermissionChecker:
    policy = PermissionPolicy.from_manifest(MANIFEST, root="/srv/p")
    return PermissionChecker(policy, metrics=metrics)


def _reason(decision: Allow | Deny) -> str:
    return "allow" if isinstance(decision, Allow) else decision.reason.value


def test_db_denies_queries_outside_declared_table_prefix(checker: PermissionChecker) -> None:
    assert (
        _reason(checker.check_capability("db", {"table": "users_account"})) == "table-out-of-scope"
    )
    assert _reason(checker.check_capability("db", {"table": "billing_invoices"})) == "allow"
    sql = {"sql": "SELECT * FROM billing_invoices WHERE id = ?", "params": [1]}
    assert _reason(checker.check_capability("db", sql)) == "allow"


def test_db_sql_allow_carries_the_exact_sql_as_target(checker: PermissionChecker) -> None:
    sql = "SELECT total FROM billing_invoices"
    decision = checker.check_capability("db", {"sql": sql})
    assert isinstance(decision, Allow)
    assert decision.target == sql


def test_secrets_denies_undeclared_name(
    checker: PermissionChecker, metrics: InMemoryMetrics
) -> None:
    assert (
        _reason(checker.check_capability("secrets", {"name": "AWS_KEY"})) == "secret-not-declared"
    )
    assert metrics.value(PERMISSION_DENIED.name, plugin="invoices", capability="secrets") == 1
    allowed = checker.check_capability("secrets", {"name": "STRIPE_SECRET_KEY"})
    assert _reason(allowed) == "allow"


def test_events_denies_publish_outside_manifest(checker: PermissionChecker) -> None:
    assert _reason(checker.check_capability("events", {"publish": "user.deleted"})) == (
        "event-not-declared"
    )
    assert _reason(checker.check_capability("events", {"publish": "invoice.created"})) == "allow"
    assert _reason(checker.check_capability("events", {"subscribe": "payment.settled"})) == "allow"
    assert _reason(checker.check_capability("events", {"subscribe": "invoice.created"})) == (
        "event-not-declared"
    )


def test_fs_and_fetch_are_reachable_through_check_capability(checker: PermissionChecker) -> None:
    assert _reason(checker.check_capability("fs", {"path": "./uploads/a"})) == "allow"
    assert _reason(checker.check_capability("fs", {"path": "./uploads/a", "mode": "write"})) == (
        "mode-not-permitted"
    )
    assert _reason(checker.check_capability("fetch", {"url": "https://api.stripe.com/"})) == "allow"


def test_every_deny_increments_the_metric_by_exactly_one(
    checker: PermissionChecker, metrics: InMemoryMetrics
) -> None:
    denials = [
        checker.check_fs("./etc/passwd"),
        checker.check_fetch("http://api.stripe.com/"),
        checker.check_capability("db", {"table": "users"}),
        checker.check_capability("secrets", {"name": "X"}),
        checker.check_capability("events", {"publish": "x"}),
        checker.check_capability("nope", {}),
        checker.check_capability("db", []),
    ]
    assert all(isinstance(d, Deny) for d in denials)
    assert metrics.value(PERMISSION_DENIED.name) == len(denials)
    for d in denials:
        assert isinstance(d, Deny)
        assert (
            metrics.value(PERMISSION_DENIED.name, capability=d.capability, reason=d.reason.value)
            >= 1
        )


def test_allows_do_not_touch_the_denial_metric(
    checker: PermissionChecker, metrics: InMemoryMetrics
) -> None:
    checker.check_fs("./uploads/a.png")
    checker.check_fetch("https://api.stripe.com/")
    assert metrics.value(PERMISSION_DENIED.name) == 0


def test_unknown_capability_ids_are_labelled_unknown_to_bound_cardinality(
    checker: PermissionChecker, metrics: InMemoryMetrics
) -> None:
    for i in range(5):
        checker.check_capability(f"cap{i}", {})
    assert metrics.value(PERMISSION_DENIED.name, capability="unknown") == 5


def test_raise_for_denial_never_names_the_resource(checker: PermissionChecker) -> None:
    decision = checker.check_capability("secrets", {"name": "AWS_ROOT_KEY"})
    assert isinstance(decision, Deny)
    with pytest.raises(SuaveplanError) as info:
        decision.raise_for_denial()
    assert info.value.code == "SAND_PERM_DENIED"
    assert info.value.details == {"capability": "secrets", "reason": "secret-not-declared"}
    assert "AWS_ROOT_KEY" not in str(info.value)


def test_db_without_a_table_prefix_denies_every_table() -> None:
    policy = PermissionPolicy.from_manifest({"name": "p"}, root="/r")
    checker = PermissionChecker(policy)
    assert _reason(checker.check_capability("db", {"table": "billing_x"})) == "table-out-of-scope"


_anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=8,
)


@given(
    capability=st.sampled_from(["fs", "fetch", "db", "secrets", "events", "other"]) | _anything,
    payload=_anything
    | st.fixed_dictionaries(
        {},
        optional={
            "path": _anything,
            "url": _anything,
            "sql": _anything,
            "params": _anything,
            "table": _anything,
            "name": _anything,
            "topic": _anything,
            "action": _anything,
            "mode": _anything,
        },
    ),
)
def test_check_capability_never_raises_on_arbitrary_input(
    capability: object, payload: object
) -> None:
    policy = PermissionPolicy.from_manifest(MANIFEST, root="/srv/p")
    decision = PermissionChecker(policy).check_capability(capability, payload)
    assert isinstance(decision, Allow | Deny)
