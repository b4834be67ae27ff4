"""`PermissionChecker`: every request becomes `Allow` or `Deny(reason)`, and every Deny is counted.

The checker never raises for bad input: a malformed payload, an unknown capability or a
matcher bug all become a `Deny` (fail closed). It does no I/O; the only side effect is one
`plugin.permission_denied_total` increment per Deny.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final, final

from suaveplan_sandbox.metrics import PERMISSION_DENIED, InMemoryMetrics, MetricsSink
from suaveplan_sandbox.permissions._decision import CAPABILITIES, Allow, Deny, DenyReason
from suaveplan_sandbox.permissions._policy import PermissionPolicy

_log = logging.getLogger("suaveplan_sandbox.permissions")

_SECRET_NAME_MAX: Final = 128
_EVENT_ACTIONS: Final = frozenset({"publish", "subscribe"})


def _log_matcher_bug(capability: str, exc: Exception) -> None:
    """Log a matcher's crash by type and where it happened, never its message or frames:
    both can hold the guest's path or URL, and with it a secret value the guest put there."""
    where = "?"
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        code = tb.tb_frame.f_code
        where = f"{code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno} in {code.co_name}"
    _log.error("%s check failed (%s at %s); denying", capability, type(exc).__qualname__, where)
    exc.__traceback__ = None


@final
class PermissionChecker:
    """Checks requests against one policy on behalf of one plugin."""

    __slots__ = ("_fetch_check", "_fs_check", "_metrics", "_plugin", "_policy", "_secrets")

    def __init__(
        self,
        policy: PermissionPolicy,
        *,
        plugin: str | None = None,
        metrics: MetricsSink | None = None,
    ) -> None:
        self._policy = policy
        self._plugin = plugin if plugin is not None else policy.plugin
        self._metrics: MetricsSink = metrics if metrics is not None else InMemoryMetrics()
        self._secrets = frozenset(policy.secrets)
        # The policy is immutable: bind its two hottest matchers once.
        self._fs_check = policy.fs.fast_check
        self._fetch_check = policy.fetch.fast_check

    @property
    def policy(self) -> PermissionPolicy:
        return self._policy

    @property
    def plugin(self) -> str:
        return self._plugin

    @property
    def metrics(self) -> MetricsSink:
        return self._metrics

    def deny(self, capability: str, reason: DenyReason) -> Deny:
        """Record and return a denial. Unknown capability labels are collapsed to `unknown`."""
        label = capability if capability in CAPABILITIES else "unknown"
        decision = Deny(capability=label, reason=reason)
        self._metrics.inc(
            PERMISSION_DENIED.name,
            {"plugin": self._plugin, "capability": label, "reason": reason.value},
        )
        return decision

    def _counted(self, decision: Allow | Deny) -> Allow | Deny:
        if isinstance(decision, Deny):
            return self.deny(decision.capability, decision.reason)
        return decision

    def check_fs(self, path: object, mode: object = "read") -> Allow | Deny:
        try:
            decision = self._fs_check(path, mode)
        except Exception as exc:  # fail closed: a matcher bug is a denial, never an escape
            _log_matcher_bug("fs", exc)
            return self.deny("fs", DenyReason.INVALID_PATH)
        if type(decision) is Allow:
            return decision
        return self._counted(decision)

    def check_fetch(self, url: object) -> Allow | Deny:
        try:
            decision = self._fetch_check(url)
        except Exception as exc:
            _log_matcher_bug("fetch", exc)
            return self.deny("fetch", DenyReason.INVALID_URL)
        if type(decision) is Allow:
            return decision
        return self._counted(decision)

    def check_connect(self, host: object, port: object) -> Allow | Deny:
        """A raw TCP connect (WASM guests' sockets), judged by the fetch host rules."""
        try:
            return self._counted(self._policy.fetch.check_host(host, port))
        except Exception as exc:
            _log_matcher_bug("connect", exc)
            return self.deny("fetch", DenyReason.INVALID_URL)

    def check_capability(self, capability_id: object, payload: object) -> Allow | Deny:
        """`fs`, `fetch`, `db`, `secrets` or `events` with a payload mapping.

        Payloads: fs `{"path", "mode"?}`; fetch `{"url"}`; db `{"table"}` or
        `{"sql", "params"?}`; secrets `{"name"}`; events `{"action": "publish"|"subscribe",
        "topic"}` (or the shorthand `{"publish": topic}` / `{"subscribe": topic}`).
        """
        if not isinstance(capability_id, str) or capability_id not in CAPABILITIES:
            return self.deny("unknown", DenyReason.UNKNOWN_CAPABILITY)
        if not isinstance(payload, Mapping):
            return self.deny(capability_id, DenyReason.MALFORMED_PAYLOAD)
        try:
            return self._dispatch(capability_id, payload)
        except Exception as exc:
            _log_matcher_bug(capability_id, exc)
            return self.deny(capability_id, DenyReason.MALFORMED_PAYLOAD)

    def _dispatch(self, capability: str, payload: Mapping[object, object]) -> Allow | Deny:
        keys = set(payload)
        if capability == "fs":
            if not keys <= {"path", "mode"} or "path" not in keys:
                return self.deny("fs", DenyReason.MALFORMED_PAYLOAD)
            return self.check_fs(payload["path"], payload.get("mode", "read"))
        if capability == "fetch":
            if keys != {"url"}:
                return self.deny("fetch", DenyReason.MALFORMED_PAYLOAD)
            return self.check_fetch(payload["url"])
        if capability == "db":
            return self._check_db(payload, keys)
        if capability == "secrets":
            return self._check_secret(payload, keys)
        return self._check_event(payload, keys)

    def _check_db(self, payload: Mapping[object, object], keys: set[object]) -> Allow | Deny:
        gate = self._policy.sql
        if keys == {"table"}:
            return self._counted(gate.check_table(payload["table"]))
        if keys in ({"sql"}, {"sql", "params"}):
            return self._counted(gate.check_query(payload["sql"], payload.get("params", ())))
        return self.deny("db", DenyReason.MALFORMED_PAYLOAD)

    def _check_secret(self, payload: Mapping[object, object], keys: set[object]) -> Allow | Deny:
        name = payload.get("name")
        if keys != {"name"} or not isinstance(name, str) or not name:
            return self.deny("secrets", DenyReason.MALFORMED_PAYLOAD)
        if len(name) > _SECRET_NAME_MAX or name not in self._secrets:
            return self.deny("secrets", DenyReason.SECRET_NOT_DECLARED)
        return Allow(rule=name, target=name)

    def _check_event(self, payload: Mapping[object, object], keys: set[object]) -> Allow | Deny:
        if keys == {"action", "topic"}:
            action, topic = payload["action"], payload["topic"]
        elif keys in ({"publish"}, {"subscribe"}):
            (action,) = keys
            topic = payload[action]
        else:
            return self.deny("events", DenyReason.MALFORMED_PAYLOAD)
        if action not in _EVENT_ACTIONS or not isinstance(topic, str):
            return self.deny("events", DenyReason.MALFORMED_PAYLOAD)
        rules = self._policy.publish_rules if action == "publish" else self._policy.subscribe_rules
        rule = rules.match(topic)
        if rule is None:
            return self.deny("events", DenyReason.EVENT_NOT_DECLARED)
        return Allow(rule=rule, target=topic)

    def may_deliver(self, topic: object) -> bool:
        """Whether an event on `topic` may be delivered to this plugin (no metric)."""
        return self._policy.subscribe_rules.match(topic) is not None
