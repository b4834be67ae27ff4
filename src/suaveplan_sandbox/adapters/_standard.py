"""`open_standard_adapters`: the production adapter set for one policy, in one call.

Each capability gets an adapter only when the manifest grants it something (a capability the
manifest does not use stays `None`, so a request fails closed with `SAND_ADAPTER_MISSING`
even if the checker were wrong):

| manifest | adapter |
|---|---|
| `permissions.fs` | `BeneathRootFs(policy.root)` under `fs_limits` |
| `permissions.fetch` | `HttpxFetch` (public addresses only unless `allow_private_network=True`) |
| `database.tablePrefix` | `SqliteDb(<data_dir>/<plugin>.sqlite3)` under `sqlite_limits`, migrated |
| `secrets` | the `secrets=` mapping (`StaticSecrets`), directory (`DirectorySecrets`) or adapter |
| `events` | the `events=` bus, or a private `InProcessEventBus` |
| always | `JsonLinesAudit` |

The result owns what it created (`aclose()`, or `async with`); adapters passed in are the
caller's to close. Nothing is read from the process environment implicitly: secrets come only
from what the host passes (use `EnvSecrets({...})` for an explicit variable mapping).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Final, final

from suaveplan_sandbox.adapters._audit import DEFAULT_AUDIT_DENIALS_PER_S, JsonLinesAudit
from suaveplan_sandbox.adapters._events import InProcessEventBus
from suaveplan_sandbox.adapters._fetch import HttpxFetch
from suaveplan_sandbox.adapters._fs import BeneathRootFs
from suaveplan_sandbox.adapters._limits import FsLimits, SqliteLimits
from suaveplan_sandbox.adapters._protocols import (
    Adapters,
    DbAdapter,
    EventsAdapter,
    SecretsAdapter,
)
from suaveplan_sandbox.adapters._secrets import DirectorySecrets, StaticSecrets
from suaveplan_sandbox.adapters._sqlite import SqliteDb, apply_migrations
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import MetricsSink
from suaveplan_sandbox.permissions._decision import Allow, Deny
from suaveplan_sandbox.permissions._policy import PermissionPolicy

_AUDIT_LOGGER: Final = logging.getLogger("suaveplan_sandbox.audit")
_DEFAULT_FS_LIMITS: Final = FsLimits()
_DEFAULT_SQLITE_LIMITS: Final = SqliteLimits()

SecretsSource = Mapping[str, str] | str | os.PathLike[str] | SecretsAdapter


def _invalid(message: str, exc: BaseException | None = None) -> SuaveplanError:
    return SuaveplanError("SAND_INVALID_ARGUMENT", message, cause=exc)


def _secrets_adapter(source: SecretsSource) -> SecretsAdapter:
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.is_dir():
            raise _invalid("secrets= names a path that is not a directory")
        return DirectorySecrets(path)
    if isinstance(source, Mapping):
        return StaticSecrets(source)
    if callable(getattr(source, "get", None)):
        return source
    raise _invalid("secrets= is a mapping, a directory or a SecretsAdapter")


@final
class StandardAdapters:
    """The adapters and audit sink for one plugin; closes what it created."""

    def __init__(
        self,
        *,
        adapters: Adapters,
        audit: JsonLinesAudit,
        applied_migrations: tuple[str, ...] = (),
        owned_fs: BeneathRootFs | None = None,
        owned_fetch: HttpxFetch | None = None,
        owned_db: SqliteDb | None = None,
    ) -> None:
        self.adapters = adapters
        self.audit = audit
        self.applied_migrations = applied_migrations
        self._owned_fs = owned_fs
        self._owned_fetch = owned_fetch
        self._owned_db = owned_db
        self._closed = False

    def __repr__(self) -> str:
        present = [
            c for c in ("fs", "fetch", "db", "secrets", "events") if getattr(self.adapters, c)
        ]
        return f"StandardAdapters({', '.join(present) or 'none'})"

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Close the adapters this object created. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owned_fetch is not None:
            await self._owned_fetch.aclose()
        if self._owned_db is not None:
            # Off the loop: closing stops a running statement and waits for it to unwind
            # (milliseconds; at most two seconds for one that cannot be interrupted).
            await asyncio.to_thread(self._owned_db.close)
        if self._owned_fs is not None:
            self._owned_fs.close()

    async def __aenter__(self) -> StandardAdapters:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def open_standard_adapters(
    policy: PermissionPolicy,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    secrets: SecretsSource | None = None,
    events: EventsAdapter | None = None,
    db: DbAdapter | None = None,
    allow_private_network: bool = False,
    redirect_recheck: Callable[[str], Allow | Deny] | None = None,
    audit_logger: logging.Logger | None = None,
    audit_include_resource: bool = False,
    audit_denials_per_s: int | None = DEFAULT_AUDIT_DENIALS_PER_S,
    audit_metrics: MetricsSink | None = None,
    fs_limits: FsLimits = _DEFAULT_FS_LIMITS,
    sqlite_limits: SqliteLimits = _DEFAULT_SQLITE_LIMITS,
) -> StandardAdapters:
    """Build the standard adapter set for `policy` (see the module docstring).

    `data_dir` is where the SQLite database lives (required when the manifest has a
    `database` block and no `db=` is given; a Postgres host passes its `PostgresDb` as `db=`).
    `events=` should be one bus shared by every plugin that talks to the others.
    `redirect_recheck` (e.g. a `PermissionChecker.check_fetch`) turns on redirect following.
    `fs_limits` and `sqlite_limits` are the limits of the `BeneathRootFs` and `SqliteDb` it
    builds (not of adapters passed in); the defaults are those adapters' own.
    Raises `SAND_INVALID_ARGUMENT` for a configuration that cannot honour the manifest and
    `SAND_DB_MIGRATION_FAILED` when the plugin's migrations do not apply.
    `audit_denials_per_s` and `audit_metrics` are the audit sink's `denials_per_s` and
    `metrics` (`JsonLinesAudit`: denial lines per plugin and capability a second, 10 by
    default, None for no limit; where the count of the others goes).
    """
    # First: an invalid audit setting is refused before anything is opened.
    audit = JsonLinesAudit(
        audit_logger if audit_logger is not None else _AUDIT_LOGGER,
        include_resource=audit_include_resource,
        denials_per_s=audit_denials_per_s,
        metrics=audit_metrics,
    )
    owned_fs: BeneathRootFs | None = None
    owned_fetch: HttpxFetch | None = None
    owned_db: SqliteDb | None = None
    applied: list[str] = []
    try:
        if policy.fs_rules:
            try:
                owned_fs = BeneathRootFs(
                    policy.root,
                    max_read_bytes=fs_limits.max_read_bytes,
                    max_write_bytes=fs_limits.max_write_bytes,
                    max_list_entries=fs_limits.max_list_entries,
                    max_root_bytes=fs_limits.max_root_bytes,
                )
            except OSError as exc:
                raise _invalid("the policy root is not an openable directory", exc) from None
        if policy.fetch_rules:
            owned_fetch = HttpxFetch(
                allow_private=allow_private_network,
                follow_redirects=redirect_recheck is not None,
                recheck=redirect_recheck,
            )
        db_adapter = db
        prefix = policy.table_prefix
        if prefix is not None and db_adapter is None:
            if policy.sql_dialect != "sqlite":
                raise _invalid("a non-SQLite policy needs its database adapter passed as db=")
            if data_dir is None:
                raise _invalid("the manifest declares a database: pass data_dir= or db=")
            folder = Path(data_dir)
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            # The manifest's name pattern keeps this one plain file name inside data_dir.
            owned_db = SqliteDb(
                folder / f"{policy.plugin}.sqlite3",
                plugin_prefix=prefix,
                statement_timeout=sqlite_limits.statement_timeout,
                max_result_rows=sqlite_limits.max_result_rows,
                max_result_bytes=sqlite_limits.max_result_bytes,
                max_result_columns=sqlite_limits.max_result_columns,
                max_value_bytes=sqlite_limits.max_value_bytes,
                max_db_bytes=sqlite_limits.max_db_bytes,
                max_statement_write_bytes=sqlite_limits.max_statement_write_bytes,
            )
            db_adapter = owned_db
            database = policy.manifest.database
            if database is not None and database.migrations is not None:
                applied = await apply_migrations(
                    owned_db,
                    policy.root / database.migrations,
                    plugin=policy.plugin,
                    version=policy.manifest.version,
                    root=policy.root,
                )
        secrets_adapter = (
            _secrets_adapter(secrets) if secrets is not None and policy.secrets else None
        )
        events_adapter = events
        if events_adapter is None and (policy.publishes or policy.subscribes):
            events_adapter = InProcessEventBus()
        adapters = Adapters(
            fs=owned_fs,
            fetch=owned_fetch,
            db=db_adapter if prefix is not None else None,
            secrets=secrets_adapter,
            events=events_adapter if (policy.publishes or policy.subscribes) else None,
        )
    except BaseException:
        if owned_fetch is not None:
            with contextlib.suppress(Exception):
                await owned_fetch.aclose()
        if owned_db is not None:
            owned_db.close()
        if owned_fs is not None:
            owned_fs.close()
        raise
    return StandardAdapters(
        adapters=adapters,
        audit=audit,
        applied_migrations=tuple(applied),
        owned_fs=owned_fs,
        owned_fetch=owned_fetch,
        owned_db=owned_db,
    )
