"""`PostgresDb`: the production `DbAdapter` on psycopg 3, enforced by the database itself.

`provision_postgres_plugin` gives each plugin a login role and a schema it owns; no other
role has USAGE on that schema and `public` is closed to PUBLIC, so a plugin's credentials
cannot read another plugin's tables even on a raw connection. The SQL gate still runs first.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from typing import Any, final

from suaveplan_sandbox.adapters._protocols import QueryResult
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.permissions._decision import Deny
from suaveplan_sandbox.permissions._sql_gate import SqlGate

_NAME = re.compile(r"[a-z][a-z0-9_]{0,40}")


async def provision_postgres_plugin(admin_conninfo: str, plugin: str, prefix: str) -> str:
    """Create (or reset the password of) the plugin's role and schema; return its conninfo."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    if not _NAME.fullmatch(plugin):
        raise SuaveplanError("SAND_INVALID_ARGUMENT", "plugin names are [a-z][a-z0-9_]*")
    role = f"suaveplan_{plugin}"
    password = secrets.token_urlsafe(24)
    async with await psycopg.AsyncConnection.connect(admin_conninfo, autocommit=True) as conn:
        exists = await (
            await conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
        ).fetchone()
        verb = "ALTER" if exists else "CREATE"
        await conn.execute(
            sql.SQL(verb + " ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)
            )
        )
        await conn.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
        await conn.execute(
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
                sql.Identifier(role), sql.Identifier(role)
            )
        )
        await conn.execute(
            sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(sql.Identifier(role))
        )
    params = conninfo_to_dict(admin_conninfo)
    params.update(user=role, password=password, options=f"-csearch_path={role}")
    del prefix  # the gate enforces the prefix; the schema enforces the plugin boundary
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


@final
class PostgresDb:
    """Queries for one plugin over its own role's connection."""

    def __init__(self, conninfo: str, *, plugin: str, prefix: str) -> None:
        self._conninfo = conninfo
        self.plugin = plugin
        self._gate = SqlGate(prefix, dialect="postgres")
        self._conn: Any = None

    def __repr__(self) -> str:
        return f"PostgresDb(plugin={self.plugin!r})"

    async def aclose(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def _execute(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        import psycopg

        try:
            if self._conn is None:
                self._conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
            cur = await self._conn.execute(sql, list(params))
            rows = tuple(tuple(r) for r in await cur.fetchall()) if cur.description else ()
            columns = tuple(d.name for d in cur.description or ())
            return QueryResult(columns=columns, rows=rows, rowcount=cur.rowcount)
        except psycopg.Error as exc:
            raise SuaveplanError(
                "SAND_DB_ERROR",
                f"the database refused the statement ({type(exc).__name__})",
                cause=exc,
            ) from None

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        decision = self._gate.check_query(sql, list(params))
        if isinstance(decision, Deny):
            raise SuaveplanError(
                "SAND_PERM_DENIED",
                "the SQL gate refused the statement",
                {"capability": "db", "reason": str(decision.reason)},
            )
        return await self._execute(sql, params)
