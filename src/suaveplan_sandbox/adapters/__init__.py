"""Host adapters: the only code that touches files, networks, databases, secrets and buses."""

from suaveplan_sandbox.adapters._fs import BeneathRootFs
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

__all__ = [
    "Adapters",
    "AuditRecord",
    "AuditSink",
    "BeneathRootFs",
    "DbAdapter",
    "EventHandler",
    "EventsAdapter",
    "FetchAdapter",
    "FsAdapter",
    "HttpRequest",
    "HttpResponse",
    "QueryResult",
    "SecretsAdapter",
    "Subscription",
]
