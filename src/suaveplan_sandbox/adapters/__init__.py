"""Host adapters: the only code that touches files, networks, databases, secrets and buses."""

from suaveplan_sandbox.adapters._audit import JsonLinesAudit, iter_audit
from suaveplan_sandbox.adapters._events import InProcessEventBus
from suaveplan_sandbox.adapters._fetch import HttpxFetch, address_refused
from suaveplan_sandbox.adapters._fs import BeneathRootFs
from suaveplan_sandbox.adapters._limits import FsLimits, SqliteLimits
from suaveplan_sandbox.adapters._postgres import (
    PostgresDb,
    apply_postgres_migrations,
    provision_postgres_plugin,
)
from suaveplan_sandbox.adapters._protocols import (
    Adapters,
    AuditRecord,
    AuditSink,
    DbAdapter,
    EventHandler,
    EventsAdapter,
    FetchAdapter,
    FsAdapter,
    HttpRequest,
    HttpResponse,
    QueryResult,
    SecretsAdapter,
    Subscription,
)
from suaveplan_sandbox.adapters._ready import Ready
from suaveplan_sandbox.adapters._redis_events import RedisEventBus
from suaveplan_sandbox.adapters._secrets import DirectorySecrets, EnvSecrets, StaticSecrets
from suaveplan_sandbox.adapters._sqlite import SqliteDb, apply_migrations
from suaveplan_sandbox.adapters._standard import StandardAdapters, open_standard_adapters

__all__ = [
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
]
