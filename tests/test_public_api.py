"""Public names are curated: each package's sorted `__all__` is pinned here."""

from __future__ import annotations

import importlib

import pytest

PINNED: dict[str, list[str]] = {
    "suaveplan_sandbox.errors": [
        "CODES",
        "ErrorCode",
        "SuaveplanError",
        "WireValue",
        "define_codes",
        "error_from_wire",
        "is_registered",
        "registered_codes",
    ],
    "suaveplan_sandbox.metrics": [
        "AUDIT_DENIALS_SUPPRESSED",
        "BUDGET_EXCEEDED",
        "CAPABILITY_CALLS",
        "EVENTS_DROPPED",
        "LOG_LINES_SUPPRESSED",
        "METRICS",
        "PERMISSION_DENIED",
        "WORKER_CRASHED",
        "FanOutMetrics",
        "InMemoryMetrics",
        "MetricDefinition",
        "MetricsSink",
        "OpenTelemetryMetrics",
        "PrometheusMetrics",
    ],
    "suaveplan_sandbox.permissions": [
        "CAPABILITIES",
        "Allow",
        "BudgetTracker",
        "Budgets",
        "Clock",
        "DatabaseBlock",
        "Decision",
        "Deny",
        "DenyReason",
        "EventsBlock",
        "Manifest",
        "MonotonicClock",
        "PermissionChecker",
        "PermissionPolicy",
        "PermissionsBlock",
        "SecretDecl",
        "budget_error",
        "load_manifest",
        "parse_manifest",
        "speedups_status",
    ],
    "suaveplan_sandbox.gateway": [
        "DEFAULT_MAX_READ_BYTES",
        "DEFAULT_MAX_WRITE_BYTES",
        "DenialListener",
        "Gateway",
    ],
    "suaveplan_sandbox.testing": [
        "PERMISSIONS_SCENARIOS",
        "VM_SCENARIOS",
        "WASM_SCENARIOS",
        "DictSecrets",
        "FakeClock",
        "FakeDb",
        "FakeFetch",
        "InMemoryEvents",
        "InMemoryFs",
        "PermissionsFactory",
        "RecordingAudit",
        "Scenario",
        "make_fixture_checker",
        "run_permissions_conformance",
        "run_scenarios",
        "run_vm_sandbox_conformance",
        "run_wasm_sandbox_conformance",
    ],
    "suaveplan_sandbox.vm": [
        "BlockingVmSandbox",
        "VmSandbox",
        "create_vm_sandbox",
        "create_vm_sandbox_sync",
    ],
    "suaveplan_sandbox.adapters": [
        "Adapters",
        "AuditRecord",
        "AuditSink",
        "BeneathRootFs",
        "DbAdapter",
        "DirectorySecrets",
        "EnvSecrets",
        "EventHandler",
        "EventsAdapter",
        "FetchAdapter",
        "FsAdapter",
        "FsLimits",
        "HttpRequest",
        "HttpResponse",
        "HttpxFetch",
        "InProcessEventBus",
        "JsonLinesAudit",
        "PostgresDb",
        "QueryResult",
        "Ready",
        "RedisEventBus",
        "SecretsAdapter",
        "SqliteDb",
        "SqliteLimits",
        "StandardAdapters",
        "StaticSecrets",
        "Subscription",
        "address_refused",
        "apply_migrations",
        "apply_postgres_migrations",
        "iter_audit",
        "open_standard_adapters",
        "provision_postgres_plugin",
    ],
}


@pytest.mark.parametrize("module", sorted(PINNED))
def test_all_is_pinned_and_sorted(module: str) -> None:
    mod = importlib.import_module(module)
    assert mod.__all__ == PINNED[module]
    assert mod.__all__ == sorted(mod.__all__, key=lambda n: (not n.isupper(), n))
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name} is exported but missing"


def test_testing_exports_the_permissions_harness_and_fakes() -> None:
    testing = importlib.import_module("suaveplan_sandbox.testing")
    for name in (
        "FakeClock",
        "InMemoryFs",
        "FakeFetch",
        "FakeDb",
        "DictSecrets",
        "InMemoryEvents",
        "run_permissions_conformance",
    ):
        assert name in testing.__all__
