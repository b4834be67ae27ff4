"""`run_permissions_conformance(label, make_checker)`: every scenario of the permissions spec.

`make_checker(manifest, metrics)` receives a manifest mapping and an `InMemoryMetrics` sink
and returns any object with `check_fs`, `check_fetch` and `check_capability` (and, for the
budget scenarios, the harness uses `make_tracker(budgets, metrics, clock)`, by default our
`BudgetTracker`). Each scenario is also a `Scenario` in `PERMISSIONS_SCENARIOS`, so a pytest
suite can parametrise over them and get one item per scenario.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, final

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import BUDGET_EXCEEDED, PERMISSION_DENIED, InMemoryMetrics
from suaveplan_sandbox.permissions import (
    Allow,
    Budgets,
    BudgetTracker,
    Deny,
    PermissionChecker,
    PermissionPolicy,
)
from suaveplan_sandbox.testing._clock import FakeClock
from suaveplan_sandbox.testing._scenarios import Scenario, run_scenarios


class CheckerLike(Protocol):
    def check_fs(self, path: object, mode: object = "read") -> Allow | Deny: ...

    def check_fetch(self, url: object) -> Allow | Deny: ...

    def check_capability(self, capability_id: object, payload: object) -> Allow | Deny: ...


class TrackerLike(Protocol):
    def start_call(self) -> None: ...

    def tick(self) -> None: ...

    def sample_cpu(self, cpu_seconds: float, *, at: float | None = None) -> None: ...

    def sample_memory(self, resident_bytes: int) -> None: ...


MakeChecker = Callable[[Mapping[str, Any], InMemoryMetrics], CheckerLike]
MakeTracker = Callable[[Mapping[str, Any], InMemoryMetrics, FakeClock], TrackerLike]

MANIFEST: Mapping[str, Any] = {
    "name": "conformance",
    "permissions": {
        "fs": ["./uploads/*", "rw:./out/*"],
        "fetch": ["api.stripe.com", "*.stripe.com", "http:legacy.example.com"],
        "budgets": {"wallClockMs": 30000, "memoryMb": 64, "cpuPercent": 50},
    },
    "database": {"tablePrefix": "billing_"},
    "secrets": [{"name": "STRIPE_SECRET_KEY"}],
    "events": {"publishes": ["invoice.created"], "subscribes": ["payment.*"]},
}


def default_make_tracker(
    budgets: Mapping[str, Any], metrics: InMemoryMetrics, clock: FakeClock
) -> TrackerLike:
    return BudgetTracker(
        Budgets.model_validate(dict(budgets)), plugin="conformance", metrics=metrics, clock=clock
    )


@final
@dataclass(frozen=True, slots=True)
class PermissionsFactory:
    make_checker: MakeChecker
    make_tracker: MakeTracker = default_make_tracker


def _checker(f: PermissionsFactory) -> tuple[CheckerLike, InMemoryMetrics]:
    metrics = InMemoryMetrics()
    return f.make_checker(MANIFEST, metrics), metrics


def _denied(name: str, decision: object, reason: str) -> Deny:
    assert isinstance(decision, Deny), f"{name}: expected Deny({reason}), got {decision!r}"
    assert decision.reason.value == reason, f"{name}: expected {reason}, got {decision.reason}"
    return decision


def _allowed(name: str, decision: object) -> Allow:
    assert isinstance(decision, Allow), f"{name}: expected Allow, got {decision!r}"
    return decision


def _denials(metrics: InMemoryMetrics, capability: str, reason: str) -> float:
    return metrics.value(
        PERMISSION_DENIED.name, plugin="conformance", capability=capability, reason=reason
    )


# -- policy -----------------------------------------------------------------------------------


def policy_reflects_manifest_exactly(f: PermissionsFactory) -> None:
    checker, _ = _checker(f)
    policy = getattr(checker, "policy", None)
    if policy is not None:
        assert tuple(policy.fs_rules) == ("./uploads/*", "rw:./out/*"), "fs rules not verbatim"
        assert tuple(policy.fetch_rules)[:2] == ("api.stripe.com", "*.stripe.com")
    _allowed("listed path", checker.check_fs("./uploads/abc.png", "read"))
    _denied("unlisted path", checker.check_fs("./secrets/key.pem", "read"), "path-not-in-allowlist")
    _allowed("listed host", checker.check_fetch("https://api.stripe.com/v1/charges"))
    _denied("unlisted host", checker.check_fetch("https://evil.com/"), "host-not-in-allowlist")


def traversal_is_normalised_before_matching(f: PermissionsFactory) -> None:
    checker, _ = _checker(f)
    _denied(
        "escape via ..",
        checker.check_fs("./uploads/../etc/passwd", "read"),
        "path-not-in-allowlist",
    )
    _denied("climb above root", checker.check_fs("../uploads/a.png"), "path-not-in-allowlist")
    _allowed("inner ..", checker.check_fs("./uploads/x/../a.png", "read"))
    _allowed("trailing slash", checker.check_fs("./uploads/dir/", "read"))


# -- fs ---------------------------------------------------------------------------------------


def fs_allows_path_matching_allowlist(f: PermissionsFactory) -> None:
    checker, _ = _checker(f)
    _allowed("allowed read", checker.check_fs("./uploads/abc.png", "read"))


def fs_denial_emits_metric_with_reason(f: PermissionsFactory) -> None:
    checker, metrics = _checker(f)
    before = _denials(metrics, "fs", "path-not-in-allowlist")
    _denied("etc/passwd", checker.check_fs("./etc/passwd", "read"), "path-not-in-allowlist")
    after = _denials(metrics, "fs", "path-not-in-allowlist")
    assert after - before == 1, f"permission_denied_total moved by {after - before}, not 1"


def fs_write_requires_rw_rule(f: PermissionsFactory) -> None:
    checker, _ = _checker(f)
    _denied("write to read-only", checker.check_fs("./uploads/a", "write"), "mode-not-permitted")
    _allowed("write under rw:", checker.check_fs("./out/report.txt", "write"))


def fs_invalid_paths_are_denied_not_raised(f: PermissionsFactory) -> None:
    checker, _ = _checker(f)
    for bad in ("", "./uploads/a\x00b", None, 42, b"./uploads/a"):
        _denied(f"path {bad!r}", checker.check_fs(bad), "invalid-path")


# -- fetch ------------------------------------------------------------------------------------


def fetch_allows_exact_host(f: PermissionsFactory) -> None:
    checker, _ = _checker(f)
    _allowed("exact host", checker.check_fetch("https://api.stripe.com/v1/charges"))


def fetch_wildcard_matches_subdomains_only(f: PermissionsFactory) -> None:
    metrics = InMemoryMetrics()
    manifest = {"name": "conformance", "permissions": {"fetch": ["*.stripe.com"]}}
    checker = f.make_checker(manifest, metrics)
    _allowed("subdomain", checker.check_fetch("https://eu.api.stripe.com/v1/charges"))
    _denied("apex", checker.check_fetch("https://stripe.com/v1"), "host-not-in-allowlist")
    _denied(
        "non-boundary suffix",
        checker.check_fetch("https://evilstripe.com/"),
        "host-not-in-allowlist",
    )


def fetch_denied_scheme_emits_metric(f: PermissionsFactory) -> None:
    checker, metrics = _checker(f)
    before = _denials(metrics, "fetch", "scheme-not-permitted")
    _denied("http", checker.check_fetch("http://api.stripe.com"), "scheme-not-permitted")
    assert _denials(metrics, "fetch", "scheme-not-permitted") - before == 1
    _allowed("http: prefix", checker.check_fetch("http://legacy.example.com/"))
    _denied("ftp", checker.check_fetch("ftp://api.stripe.com/"), "scheme-not-permitted")
    _denied("garbage", checker.check_fetch("not a url"), "invalid-url")


# -- capabilities -----------------------------------------------------------------------------


def db_denies_table_outside_prefix(f: PermissionsFactory) -> None:
    checker, _ = _checker(f)
    _denied(
        "unscoped table",
        checker.check_capability("db", {"table": "users_account"}),
        "table-out-of-scope",
    )
    _allowed("scoped table", checker.check_capability("db", {"table": "billing_invoices"}))
    _denied(
        "table hidden in a subquery",
        checker.check_capability(
            "db",
            {"sql": "SELECT * FROM billing_a WHERE id IN (SELECT id FROM users)", "params": []},
        ),
        "table-out-of-scope",
    )
    _denied(
        "stacked statements",
        checker.check_capability("db", {"sql": "SELECT 1; DROP TABLE billing_a", "params": []}),
        "statement-not-permitted",
    )


def secrets_denies_undeclared_name(f: PermissionsFactory) -> None:
    checker, metrics = _checker(f)
    before = _denials(metrics, "secrets", "secret-not-declared")
    _denied(
        "AWS_KEY", checker.check_capability("secrets", {"name": "AWS_KEY"}), "secret-not-declared"
    )
    assert _denials(metrics, "secrets", "secret-not-declared") - before == 1
    _allowed("declared", checker.check_capability("secrets", {"name": "STRIPE_SECRET_KEY"}))


def events_denies_publish_outside_manifest(f: PermissionsFactory) -> None:
    checker, _ = _checker(f)
    publish = {"action": "publish", "topic": "user.deleted"}
    _denied("publish", checker.check_capability("events", publish), "event-not-declared")
    ok = {"action": "publish", "topic": "invoice.created"}
    _allowed("declared publish", checker.check_capability("events", ok))
    sub = {"action": "subscribe", "topic": "payment.settled"}
    _allowed("subscribe via *", checker.check_capability("events", sub))
    bad_sub = {"action": "subscribe", "topic": "invoice.created"}
    _denied("subscribe", checker.check_capability("events", bad_sub), "event-not-declared")


def unknown_capabilities_and_malformed_payloads_are_denied(f: PermissionsFactory) -> None:
    checker, _ = _checker(f)
    _denied("unknown id", checker.check_capability("shell", {"cmd": "id"}), "unknown-capability")
    _denied("non-str id", checker.check_capability(None, {}), "unknown-capability")
    for cap, payload in (
        ("db", "SELECT 1"),
        ("db", {"table": "billing_a", "sql": "SELECT 1"}),
        ("secrets", {"name": 7}),
        ("events", {"action": "delete", "topic": "invoice.created"}),
        ("fetch", {"href": "https://api.stripe.com"}),
    ):
        _denied(f"{cap} {payload!r}", checker.check_capability(cap, payload), "malformed-payload")


# -- error envelope ---------------------------------------------------------------------------


def permission_denied_error_envelope_is_redaction_safe(f: PermissionsFactory) -> None:
    checker, _ = _checker(f)
    cases: list[tuple[str, str, Callable[[], Allow | Deny]]] = [
        ("fs", "etc/passwd", lambda: checker.check_fs("./etc/passwd")),
        ("fetch", "evil.example", lambda: checker.check_fetch("https://evil.example/x")),
        ("db", "users_account", lambda: checker.check_capability("db", {"table": "users_account"})),
        ("secrets", "AWS_KEY", lambda: checker.check_capability("secrets", {"name": "AWS_KEY"})),
        (
            "events",
            "user.deleted",
            lambda: checker.check_capability("events", {"publish": "user.deleted"}),
        ),
    ]
    for capability, secret_word, run in cases:
        decision = run()
        assert isinstance(decision, Deny), f"{capability}: expected a Deny"
        try:
            decision.raise_for_denial()
        except SuaveplanError as exc:
            assert exc.code == "SAND_PERM_DENIED"
            assert exc.details == {"capability": capability, "reason": decision.reason.value}
            for text in (exc.message, str(exc), repr(exc), repr(exc.to_wire())):
                assert secret_word not in text, f"{capability}: denied resource leaked"
            rebuilt = SuaveplanError.from_wire(exc.to_wire())
            assert rebuilt.code == exc.code and rebuilt.details == exc.details
        else:
            raise AssertionError(f"{capability}: raise_for_denial did not raise")


# -- budgets ----------------------------------------------------------------------------------


def _budget_error(run: Callable[[], None]) -> SuaveplanError | None:
    try:
        run()
    except SuaveplanError as exc:
        return exc
    return None


def wall_clock_breach_raises_budget_exceeded(f: PermissionsFactory) -> None:
    metrics, clock = InMemoryMetrics(), FakeClock()
    tracker = f.make_tracker({"wallClockMs": 30000}, metrics, clock)
    tracker.start_call()
    clock.advance_ms(30000)
    assert _budget_error(tracker.tick) is None, "30000 ms of 30000 is not a breach"
    clock.advance_ms(1)
    err = _budget_error(tracker.tick)
    assert err is not None and err.code == "BUDGET_EXCEEDED", "30001 ms must breach"
    assert err.details.get("budget") == "wallClockMs"
    assert metrics.value(BUDGET_EXCEEDED.name, plugin="conformance", budget="wallClockMs") == 1


def budget_tracker_is_idempotent_on_repeated_samples(f: PermissionsFactory) -> None:
    metrics, clock = InMemoryMetrics(), FakeClock()
    tracker = f.make_tracker({"memoryMb": 64}, metrics, clock)
    over = 65 * 1024 * 1024
    errors = [_budget_error(lambda: tracker.sample_memory(over)) for _ in range(3)]
    raised = [e for e in errors if e is not None]
    assert len(raised) == 1, f"{len(raised)} breaches raised for one dimension"
    assert raised[0].details.get("budget") == "memoryMb"
    assert metrics.value(BUDGET_EXCEEDED.name, plugin="conformance", budget="memoryMb") == 1


def cpu_percent_is_judged_over_a_sliding_window(f: PermissionsFactory) -> None:
    metrics, clock = InMemoryMetrics(), FakeClock()
    tracker = f.make_tracker({"cpuPercent": 50}, metrics, clock)

    # 40% of a core for two seconds: within budget.
    def sample(cpu: float, at: float) -> Callable[[], None]:
        return lambda: tracker.sample_cpu(cpu, at=at)

    for step in range(21):
        assert _budget_error(sample(step * 0.04, step * 0.1)) is None
    # Then a full core: the window fills with 100% and breaches.
    base_cpu, base_t = 20 * 0.04, 2.0
    errors = [
        _budget_error(sample(base_cpu + step * 0.1, base_t + step * 0.1)) for step in range(1, 21)
    ]
    raised = [e for e in errors if e is not None]
    assert len(raised) == 1, f"expected exactly one cpuPercent breach, got {len(raised)}"
    assert raised[0].details.get("budget") == "cpuPercent"


PERMISSIONS_SCENARIOS: tuple[Scenario[PermissionsFactory], ...] = tuple(
    Scenario(fn.__name__.replace("_", " "), fn)
    for fn in (
        policy_reflects_manifest_exactly,
        traversal_is_normalised_before_matching,
        fs_allows_path_matching_allowlist,
        fs_denial_emits_metric_with_reason,
        fs_write_requires_rw_rule,
        fs_invalid_paths_are_denied_not_raised,
        fetch_allows_exact_host,
        fetch_wildcard_matches_subdomains_only,
        fetch_denied_scheme_emits_metric,
        db_denies_table_outside_prefix,
        secrets_denies_undeclared_name,
        events_denies_publish_outside_manifest,
        unknown_capabilities_and_malformed_payloads_are_denied,
        permission_denied_error_envelope_is_redaction_safe,
        wall_clock_breach_raises_budget_exceeded,
        budget_tracker_is_idempotent_on_repeated_samples,
        cpu_percent_is_judged_over_a_sliding_window,
    )
)


def make_fixture_checker(manifest: Mapping[str, Any], metrics: InMemoryMetrics) -> CheckerLike:
    """Our own checker, as the in-package fixture the spec's harness scenario runs."""
    policy = PermissionPolicy.from_manifest(manifest, root="/nonexistent-root")
    return PermissionChecker(policy, plugin="conformance", metrics=metrics)


def run_permissions_conformance(
    label: str,
    make_checker: MakeChecker,
    *,
    make_tracker: MakeTracker | None = None,
) -> int:
    """Run every permissions scenario against `make_checker`; returns how many passed.

    Raises `AssertionError` naming each failed scenario. Needs no test framework.
    """
    factory = PermissionsFactory(make_checker, make_tracker or default_make_tracker)
    return run_scenarios(label, PERMISSIONS_SCENARIOS, factory)
