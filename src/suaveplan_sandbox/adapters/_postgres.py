"""`PostgresDb`: the production `DbAdapter` on psycopg 3, enforced by the database itself.

Theory of operation. `provision_postgres_plugin` gives each plugin three things and touches
nothing else in the database (no change to `public`, to PUBLIC's privileges, or to any other
role):

- a schema `suaveplan_<plugin>` owned by a NOLOGIN role `suaveplan_<plugin>_owner`, which
  has no privilege anywhere else;
- a LOGIN role `suaveplan_<plugin>` (the runtime role) with USAGE on that schema only (no
  CREATE) and, once migrations ran, SELECT/INSERT/UPDATE/DELETE on the schema's *prefixed*
  tables and USAGE on their sequences — nothing else is granted to it;
- a host schema `suaveplan_host` (no privileges for anyone but the admin) holding the
  migrations table.

`apply_postgres_migrations` runs the plugin's SQL files with the admin connection but as the
owner role (`SET LOCAL ROLE`), with `search_path` set to the plugin schema, one transaction per
file. Every statement of every pending file passes the SQL gate's migration check *before*
anything runs; the statements executed are the gate's own rendering (what was checked is what
runs). Inside the transaction the owner role cannot touch another plugin's schema (no USAGE) or
create outside its own; before commit, any relation in the schema without the prefix rolls the
migration back. A plugin's runtime credentials therefore cannot read another plugin's table even
on a raw connection, and cannot run DDL at all.

Every session here reads literals as the gate does (`standard_conforming_strings = on`,
whatever the server says) and runs each checked statement alone on the extended protocol, so
a text the gate read as one statement is one statement to PostgreSQL.

Disk. PostgreSQL bounds a session's temporary files (sorts, hashes, materialised CTEs that
outgrow `work_mem`) with `temp_file_limit`, a superuser-only setting: the runtime role can
neither set nor raise it, so `provision_postgres_plugin` sets it on that role (`ALTER ROLE
... SET`, applied at each login; needs a superuser admin, or `temp_file_limit_bytes=None` to
leave it to the DBA), and `PostgresDb.temp_file_limit_bytes()` reports what a session of the
role actually has. Table data has no quota PostgreSQL can enforce per role or schema; that
takes a tablespace on a volume with its own quota, which is the DBA's to set up.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import secrets
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, final

from suaveplan_sandbox.adapters._credentials import url_passwords
from suaveplan_sandbox.adapters._migration_files import migration_files, read_migration
from suaveplan_sandbox.adapters._protocols import QueryResult
from suaveplan_sandbox.adapters._sqlite import (
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_MAX_RESULT_ROWS,
    DEFAULT_STATEMENT_TIMEOUT,
    positive_limit,
)
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.permissions._decision import Allow, Deny
from suaveplan_sandbox.permissions._sql_gate import MAX_POSTGRES_PATTERN, SqlGate

_CLIENT_ENCODING: Final = "UTF8"
_NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,40}")
_PREFIX: Final = re.compile(r"[a-z_][a-z0-9_]{0,30}")
_DML_PRIVILEGES: Final = "SELECT, INSERT, UPDATE, DELETE"
_ROLE_ATTRIBUTES: Final = "{} NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"

_CANCEL_TIMEOUT: Final = 5.0
# A plugin's temporary files at one time, as `SqliteDb.max_statement_write_bytes`.
DEFAULT_TEMP_FILE_LIMIT_BYTES: Final = 1024**3
_MAX_TEMP_FILE_LIMIT_KB: Final = 2**31 - 1  # PostgreSQL's own maximum (kB)
_SHAPE_CACHE: Final = 256
# psycopg's placeholder syntax (`_re_placeholder` in psycopg/_queries.py), over str: `%`, then
# `(name)` and one character, or any one character but a newline.
_PSYCOPG_PLACEHOLDER: Final = re.compile(r"%(?:\(([^)]+)\).|.)")


def _names(plugin: str, prefix: str) -> tuple[str, str]:
    """(runtime role = schema name, owner role); validates plugin and prefix."""
    if not _NAME.fullmatch(plugin):
        raise SuaveplanError("SAND_INVALID_ARGUMENT", "plugin names are [a-z][a-z0-9_]*")
    if not _PREFIX.fullmatch(prefix):
        raise SuaveplanError("SAND_INVALID_ARGUMENT", "table prefixes are [a-z_][a-z0-9_]*")
    return f"suaveplan_{plugin}", f"suaveplan_{plugin}_owner"


async def _ensure_role(conn: Any, role: str, attributes: Any) -> None:
    from psycopg import sql

    found = await (
        await conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
    ).fetchone()
    verb = sql.SQL("ALTER ROLE" if found else "CREATE ROLE")
    await conn.execute(sql.SQL("{} {} {}").format(verb, sql.Identifier(role), attributes))


def _temp_file_limit_kb(limit: int | None) -> int | None:
    if limit is None:
        return None
    positive_limit(limit, "temp_file_limit_bytes", "provision_postgres_plugin")
    kb = -(-int(limit) // 1024)
    if type(limit) is not int or kb > _MAX_TEMP_FILE_LIMIT_KB:
        raise SuaveplanError(
            "SAND_INVALID_ARGUMENT",
            "temp_file_limit_bytes is an int of at most 2 TiB, or None",
        )
    return kb


async def provision_postgres_plugin(
    admin_conninfo: str,
    plugin: str,
    prefix: str,
    *,
    temp_file_limit_bytes: int | None = DEFAULT_TEMP_FILE_LIMIT_BYTES,
) -> str:
    """Create (or reset the password of) the plugin's roles and schema; return its conninfo.

    Idempotent: re-provisioning rotates the runtime role's password and keeps its grants.
    `temp_file_limit_bytes` (rounded up to whole kB) becomes the runtime role's
    `temp_file_limit`, which only a superuser may set: an admin that may not fails with
    `SAND_DB_ERROR` (`details.reason` `temp-file-limit-not-settable`) and changes nothing.
    None leaves the role's setting as it is (the DBA's).
    """
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    role, owner = _names(plugin, prefix)
    temp_kb = _temp_file_limit_kb(temp_file_limit_bytes)
    password = secrets.token_urlsafe(24)
    try:
        async with (
            await psycopg.AsyncConnection.connect(admin_conninfo) as conn,
            conn.transaction(),
        ):
            await _ensure_role(conn, owner, sql.SQL(_ROLE_ATTRIBUTES.format("NOLOGIN")))
            await _ensure_role(
                conn,
                role,
                sql.SQL(_ROLE_ATTRIBUTES.format("LOGIN") + " PASSWORD {}").format(
                    sql.Literal(password)
                ),
            )
            if temp_kb is not None:  # first: an admin that may not set it gets a clear error
                await _set_temp_file_limit(conn, role, temp_kb)
            # The admin must be able to SET ROLE to the owner while migrating.
            await conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(sql.Identifier(owner)))
            await conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
                    sql.Identifier(role), sql.Identifier(owner)
                )
            )
            await conn.execute(
                sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(sql.Identifier(role))
            )
            await conn.execute(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                    sql.Identifier(role), sql.Identifier(role)
                )
            )
            await _ensure_host_schema(conn)
    except psycopg.Error as exc:
        raise SuaveplanError(
            "SAND_DB_ERROR", f"provisioning failed ({type(exc).__name__})", cause=exc
        ) from None
    params = conninfo_to_dict(admin_conninfo)
    params.update(user=role, password=password, options=f"-csearch_path={role}")
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


async def _set_temp_file_limit(conn: Any, role: str, kb: int) -> None:
    """The runtime role's `temp_file_limit`, from its next login on; a refusal rolls the
    whole provisioning back (the caller's transaction)."""
    import psycopg
    from psycopg import sql

    try:
        await conn.execute(
            sql.SQL("ALTER ROLE {} SET temp_file_limit = {}").format(
                sql.Identifier(role), sql.Literal(f"{kb}kB")
            )
        )
    except psycopg.errors.InsufficientPrivilege as exc:
        raise SuaveplanError(
            "SAND_DB_ERROR",
            "provisioning failed: the admin may not set temp_file_limit (a superuser-only "
            "setting); pass temp_file_limit_bytes=None and have the DBA set it",
            {"reason": "temp-file-limit-not-settable"},
            cause=exc,
        ) from None


async def _ensure_host_schema(conn: Any) -> None:
    # A new schema grants nothing to PUBLIC: only the admin sees the migration history.
    await conn.execute("CREATE SCHEMA IF NOT EXISTS suaveplan_host")
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS suaveplan_host.migrations ("
        "plugin text NOT NULL, name text NOT NULL, version text, sha256 text NOT NULL, "
        "applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (plugin, name))"
    )


def _plan(gate: SqlGate, file: Path) -> tuple[list[str], str]:
    """(statements to run, sha256 of the text checked) for one file, or a coded refusal."""
    text = read_migration(file)  # a regular file, not a link, bounded; else coded
    decisions = gate.check_migration(text)
    if not decisions or any(isinstance(d, Deny) for d in decisions):
        reason = next((str(d.reason) for d in decisions if isinstance(d, Deny)), "empty")
        raise SuaveplanError(
            "SAND_DB_MIGRATION_FAILED",
            "a migration contains a statement outside the plugin's prefix",
            {"migration": file.name, "reason": reason},
        )
    statements = [d.target or "" for d in decisions if isinstance(d, Allow)]
    return statements, hashlib.sha256(text.encode("utf-8")).hexdigest()


async def apply_postgres_migrations(
    admin_conninfo: str,
    migrations_dir: str | os.PathLike[str],
    *,
    plugin: str,
    prefix: str,
    version: str | None = None,
    root: str | os.PathLike[str] | None = None,
) -> list[str]:
    """Apply the plugin's `*.sql` files in name order, each once; returns the names applied.
    `root`: the plugin's root, above `migrations_dir`; no component from it down to the
    folder may be a symbolic link (`_migration_files.migration_files`).

    Needs `provision_postgres_plugin` first. A pending file that the gate refuses stops the run
    before *any* pending file executes; a file that fails in the database is rolled back
    whole (earlier files stay applied). Raises `SAND_DB_MIGRATION_FAILED`.
    """
    import psycopg

    role, owner = _names(plugin, prefix)
    gate = SqlGate(prefix, dialect="postgres")
    files = migration_files(migrations_dir, root=root)
    applied: list[str] = []
    try:
        # UTF8 whatever the server, database or role says: the plugin's text is Unicode.
        async with await psycopg.AsyncConnection.connect(
            admin_conninfo, client_encoding=_CLIENT_ENCODING
        ) as conn:
            async with conn.transaction():
                await _ensure_host_schema(conn)
                rows = await (
                    await conn.execute(
                        "SELECT name FROM suaveplan_host.migrations WHERE plugin = %s", (plugin,)
                    )
                ).fetchall()
            done = {r[0] for r in rows}
            pending = [f for f in files if f.name not in done]
            plans = [(f, _plan(gate, f)) for f in pending]  # refuse before anything runs
            for file, (statements, digest) in plans:
                try:
                    async with conn.transaction():
                        await _run_one(
                            conn,
                            role=role,
                            owner=owner,
                            prefix=prefix,
                            statements=statements,
                            name=file.name,
                        )
                        await conn.execute(
                            "INSERT INTO suaveplan_host.migrations (plugin, name, version, sha256)"
                            " VALUES (%s, %s, %s, %s)",
                            (
                                plugin,
                                file.name,
                                version,
                                digest,
                            ),
                        )
                except psycopg.Error as exc:
                    raise SuaveplanError(
                        "SAND_DB_MIGRATION_FAILED",
                        f"migration failed and was rolled back ({type(exc).__name__})",
                        {"migration": file.name},
                        cause=exc,
                    ) from None
                applied.append(file.name)
    except psycopg.Error as exc:
        raise SuaveplanError(
            "SAND_DB_MIGRATION_FAILED",
            f"migrations could not run ({type(exc).__name__})",
            cause=exc,
        ) from None
    return applied


async def _run_one(
    conn: Any, *, role: str, owner: str, prefix: str, statements: list[str], name: str
) -> None:
    """One migration inside the caller's transaction: as the owner role, in the plugin schema."""
    from psycopg import sql

    # The gate read (and rendered) string literals as PostgreSQL reads them with this on.
    # Off (a server, database or role setting), a backslash escapes a quote, and a migration
    # the gate read as one statement ran `RESET ROLE` and then anything as the admin.
    await conn.execute("SET LOCAL standard_conforming_strings TO on")
    await conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(owner)))
    await conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(role)))
    for statement in statements:
        # `binary=True` takes the extended protocol, which runs exactly one statement: a text
        # without parameters would otherwise go over the simple protocol, which runs all.
        await conn.execute(statement, binary=True)
    await conn.execute("RESET ROLE")
    relations = await (
        await conn.execute(
            "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %s",
            (role,),
        )
    ).fetchall()
    for relname, relkind in relations:
        if not str(relname).startswith(prefix):
            raise SuaveplanError(
                "SAND_DB_MIGRATION_FAILED",
                "a migration created an object without the plugin's prefix",
                {"migration": name},
            )
        target = sql.Identifier(role, str(relname))
        if relkind in ("r", "v", "p", "m"):
            privileges = _DML_PRIVILEGES if relkind != "m" else "SELECT"
            await conn.execute(
                sql.SQL("GRANT " + privileges + " ON TABLE {} TO {}").format(
                    target, sql.Identifier(role)
                )
            )
        elif relkind == "S":
            await conn.execute(
                sql.SQL("GRANT USAGE, SELECT ON SEQUENCE {} TO {}").format(
                    target, sql.Identifier(role)
                )
            )


def _conninfo_passwords(conninfo: str) -> tuple[str, ...]:
    """Every password written in `conninfo`, in either form libpq takes: the one libpq uses
    (`conninfo_to_dict`: a `password=` keyword, quoted or not, or a URL's), and for a URL
    also its userinfo's and query's, which a later one shadows but the text still shows.
    A password with a quote or a backslash also comes in its key=value quoting (`\\'`,
    `\\\\`): the redactor finds that in a `repr` of the conninfo, where the plain value's
    escapes are not. An unparseable conninfo is `SAND_INVALID_ARGUMENT`, without libpq's
    message or a cause: that message quotes the conninfo, the password included."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        params: dict[str, Any] | None = conninfo_to_dict(conninfo)
    except psycopg.Error:
        params = None
    if params is None:  # raised out here: not even as `__context__` does libpq's text ride along
        raise SuaveplanError(
            "SAND_INVALID_ARGUMENT", "the conninfo cannot be parsed", {"argument": "conninfo"}
        )
    found = [str(params.get("password") or "")]
    if conninfo.startswith(("postgresql://", "postgres://")):
        found += url_passwords(conninfo)
    found += [v.replace("\\", "\\\\").replace("'", "\\'") for v in found]
    return tuple(dict.fromkeys(v for v in found if v))


def _psycopg_text(sql: str) -> str | None:
    """The text psycopg sends PostgreSQL for `sql` with a list of values: each `%s`, `%b`,
    `%t` becomes `$1`, `$2`, … and `%%` becomes `%`, wherever they are (in string literals
    and comments too). None where psycopg refuses the text itself (named or unknown
    placeholders), since then nothing is sent."""
    out: list[str] = []
    pos = count = 0
    for match in _PSYCOPG_PLACEHOLDER.finditer(sql):
        out.append(sql[pos : match.start()])
        pos = match.end()
        placeholder = match.group(0)
        if placeholder == "%%":
            out.append("%")
        elif match.group(1) is None and placeholder[-1] in "sbt":
            count += 1
            out.append(f"${count}")
        else:
            return None
    out.append(sql[pos:])
    return "".join(out)


def _disk_reason(exc: Exception) -> str | None:
    """The refusal reason of a server error about disk space, or None for any other."""
    state = getattr(exc, "sqlstate", None)
    if state == "53400":  # configuration_limit_exceeded: temp_file_limit
        return "statement-write-limit"
    if state == "53100":  # disk_full
        return "database-full"
    return None


@final
class PostgresDb:
    """Queries for one plugin over its own runtime role's connection.

    The host's time and memory: the connection runs with `statement_timeout` (PostgreSQL
    ends a statement past it); cancelling the awaiting coroutine cancels the statement on
    the server (psycopg), and `aclose()` does the same before closing, so no statement is
    left running for a connection nobody reads. A statement that returns rows is read as
    a stream and refused past `max_result_rows` rows or about `max_result_bytes` bytes
    (counted as `SqliteDb` counts them), and one that may also write (RETURNING, a
    data-modifying CTE) runs in a transaction that only commits once its rows are accepted.
    Refusals are `SAND_DB_ERROR` with `details.reason` (`statement-timeout`,
    `result-too-large`, `closed`, and for the disk `statement-write-limit`: past the role's
    `temp_file_limit`, see `temp_file_limit_bytes()`; `database-full`: the server's disk).
    A single row is still read whole before it is counted (PostgreSQL builds rows of up to
    1 GB).
    """

    def __init__(
        self,
        conninfo: str,
        *,
        plugin: str,
        prefix: str,
        statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT,
        max_result_rows: int = DEFAULT_MAX_RESULT_ROWS,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        for value, name in (
            (statement_timeout, "statement_timeout"),
            (max_result_rows, "max_result_rows"),
            (max_result_bytes, "max_result_bytes"),
        ):
            positive_limit(value, name, "PostgresDb")
        self._conninfo = conninfo
        self.plugin = plugin
        self._gate = SqlGate(prefix, dialect="postgres")
        self._timeout_ms = max(1, round(statement_timeout * 1000))
        self._max_rows = int(max_result_rows)
        self._max_bytes = int(max_result_bytes)
        self._conn: Any = None
        self._connecting: asyncio.Lock | None = None
        self._closed = False
        self._shapes: OrderedDict[str, tuple[bool, bool]] = OrderedDict()

    def __repr__(self) -> str:
        return f"PostgresDb(plugin={self.plugin!r})"

    def redaction_values(self) -> tuple[str, ...]:
        """The password(s) in this adapter's conninfo, for the gateway's redactor (a driver
        error that quotes the conninfo is then scrubbed). `SAND_INVALID_ARGUMENT` when the
        conninfo cannot be parsed."""
        return _conninfo_passwords(self._conninfo)

    async def aclose(self) -> None:
        """Cancel a running statement on the server, then close. Idempotent."""
        import psycopg

        self._closed = True
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
                # Closing alone leaves the server running the statement until it next
                # writes to the socket, which a runaway aggregate never does.
                if hasattr(conn, "cancel_safe"):  # psycopg 3.2 and later
                    await conn.cancel_safe(timeout=_CANCEL_TIMEOUT)
                else:
                    await asyncio.to_thread(conn.cancel)
        except psycopg.Error:
            pass  # the server may be gone; closing is all that is left
        finally:
            await conn.close()

    async def _connection(self) -> Any:
        import psycopg
        from psycopg import sql

        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._closed:
                raise SuaveplanError(
                    "SAND_DB_ERROR", "the database is closed", {"reason": "closed"}
                )
            if self._conn is None:
                # UTF8 whatever the server, database or role says (a client option outranks
                # their settings): with another, text the plugin sent or stored could not be
                # encoded (an untranslated UnicodeEncodeError) or would come back changed.
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True, client_encoding=_CLIENT_ENCODING
                )
                try:
                    await conn.execute(
                        sql.SQL("SET statement_timeout = {}").format(sql.Literal(self._timeout_ms))
                    )
                    # The gate reads string literals as PostgreSQL does with this on; a
                    # server, database or role setting it off would make a backslash escape
                    # a quote, and text the gate took for a literal would run as code.
                    await conn.execute("SET standard_conforming_strings = on")
                except BaseException:
                    await conn.close()
                    raise
                if self._closed:  # closed while it connected
                    await conn.close()
                    raise SuaveplanError(
                        "SAND_DB_ERROR", "the database is closed", {"reason": "closed"}
                    )
                self._conn = conn
            return self._conn

    async def temp_file_limit_bytes(self) -> int | None:
        """The `temp_file_limit` this adapter's sessions run under, in bytes; None when
        unlimited (nobody set it: see `provision_postgres_plugin`). Connects if needed."""
        import psycopg

        try:
            conn = await self._connection()
            row = await (
                await conn.execute(
                    "SELECT setting::bigint FROM pg_settings WHERE name = 'temp_file_limit'"
                )
            ).fetchone()
        except psycopg.Error as exc:
            raise SuaveplanError(
                "SAND_DB_ERROR", f"the setting could not be read ({type(exc).__name__})", cause=exc
            ) from None
        kb = int(row[0]) if row is not None else -1
        return None if kb < 0 else kb * 1024

    def _shape(self, sql: str) -> tuple[bool, bool]:
        shapes = self._shapes
        shape = shapes.get(sql)
        if shape is None:
            shape = shapes[sql] = self._gate.query_shape(sql)
            if len(shapes) > _SHAPE_CACHE:
                shapes.popitem(last=False)
        else:
            shapes.move_to_end(sql)
        return shape

    async def _read(self, cur: Any, sql: str, params: list[WireValue]) -> list[tuple[Any, ...]]:
        """The statement's rows, streamed, refused past the row or byte limit (leaving the
        stream cancels the statement on the server)."""
        rows: list[tuple[Any, ...]] = []
        size = 0
        # Row by row (libpq's single-row mode): a chunk of rows would be buffered whole
        # before any of it is counted, and PostgreSQL sends rows of up to 1 GB.
        async with contextlib.aclosing(cur.stream(sql, params)) as stream:
            async for row in stream:
                size += 8 + sum([len(v) if type(v) in (str, bytes) else 8 for v in row])
                rows.append(tuple(row))
                if size > self._max_bytes or len(rows) > self._max_rows:
                    raise SuaveplanError(
                        "SAND_DB_ERROR",
                        "the result is larger than the adapter returns; nothing was written",
                        {
                            "reason": "result-too-large",
                            "max_rows": self._max_rows,
                            "max_bytes": self._max_bytes,
                        },
                    )
        return rows

    async def _run(self, conn: Any, sql: str, params: list[WireValue]) -> QueryResult:
        returns_rows, writes = self._shape(sql)
        cur = conn.cursor()
        if not returns_rows:
            # One statement whatever PostgreSQL reads: see `_run_one` (rows are streamed,
            # which takes the extended protocol already).
            await cur.execute(sql, params, binary=True)
            return QueryResult(rowcount=cur.rowcount)
        if writes:
            async with conn.transaction():
                rows = await self._read(cur, sql, params)
        else:
            rows = await self._read(cur, sql, params)
        columns = tuple(d.name for d in cur.description or ())
        if not rows and not columns and not writes:
            columns = await self._columns(conn, sql, params)
        return QueryResult(columns=columns, rows=tuple(rows), rowcount=len(rows))

    async def _columns(self, conn: Any, sql: str, params: list[WireValue]) -> tuple[str, ...]:
        """The column names of a read that returned no rows: a stream reports them only
        with its first row, so the read is described as a subquery that returns none. It
        can only read what the checked statement reads; if it fails, no names."""
        import psycopg

        body = sql.rstrip().removesuffix(";")  # the gate allows one trailing `;`
        # The checked statement as a subquery, run by the plugin's own role like the statement.
        probe = f"SELECT * FROM (\n{body}\n) AS _described LIMIT 0"  # noqa: S608 — see above
        try:
            cur = await conn.execute(probe, params, binary=True)
        except psycopg.Error:
            return ()
        return tuple(d.name for d in cur.description or ())

    async def _execute(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        """The engine path, after the gate. Tests call it directly to prove the grants."""
        import psycopg

        try:
            conn = await self._connection()
            return await self._run(conn, sql, list(params))
        except psycopg.errors.QueryCanceled as exc:
            reason = "closed" if self._closed else "statement-timeout"
            details: dict[str, WireValue] = {"reason": reason}
            if reason == "statement-timeout":
                details["limit_ms"] = self._timeout_ms
            raise SuaveplanError(
                "SAND_DB_ERROR",
                f"the statement was stopped ({reason}) and rolled back",
                details,
                cause=exc,
            ) from None
        except psycopg.Error as exc:
            refused = "closed" if self._closed else _disk_reason(exc)
            details = {} if refused is None else {"reason": refused}
            raise SuaveplanError(
                "SAND_DB_ERROR",
                f"the database refused the statement ({type(exc).__name__})",
                details,
                cause=exc,
            ) from None
        except UnicodeEncodeError:
            # A str psycopg cannot encode as UTF8 (a lone surrogate), in a value or in the
            # text: it raises before anything is sent, and no psycopg.Error. No cause: a
            # UnicodeEncodeError holds the whole value (as `SqliteDb` refuses it).
            raise SuaveplanError(
                "SAND_DB_ERROR",
                "a parameter or the text cannot be encoded (UnicodeEncodeError)",
                {"reason": "parameter-invalid"},
            ) from None

    async def query(self, sql: str, params: Sequence[WireValue]) -> QueryResult:
        decision = self._gate.check_query(sql, list(params))
        if isinstance(decision, Deny):
            decision.raise_for_denial()
        # PostgreSQL parses psycopg's rewrite of the text, not the text: a `$n` glued to `$q`
        # opens a dollar-quoted string the gate never saw (`SELECT $q%s, '$q$ <any SQL> --'`
        # ran the literal's contents as code). So the rewrite must pass the gate as well.
        sent = _psycopg_text(sql)
        if sent is None:
            # Refused here rather than by psycopg, which raises a UnicodeDecodeError (no
            # psycopg.Error) for a `%` before a non-ASCII character.
            raise SuaveplanError(
                "SAND_DB_ERROR",
                "placeholders are %s, %b or %t, and a literal % is written %%",
                {"reason": "placeholder-not-supported"},
            )
        if sent != sql and isinstance(self._gate.check_query(sent, list(params)), Deny):
            raise SuaveplanError(
                "SAND_DB_ERROR",
                "the statement psycopg would send (placeholders as $n) is not permitted",
                {"reason": "placeholder-changes-statement"},
            )
        # A LIKE pattern or a strpos/replace/split_part needle runs in a loop no timeout
        # interrupts, for the text's length times its own: the gate lets it be built only of
        # short literals and parameters, and those parameters are bounded here.
        for number in self._gate.bounded_parameters(sent):
            value = params[number - 1] if 0 < number <= len(params) else None
            if isinstance(value, str | bytes) and len(value) > MAX_POSTGRES_PATTERN:
                raise SuaveplanError(
                    "SAND_DB_ERROR",
                    "a pattern or search string is longer than the adapter allows",
                    {"reason": "pattern-too-long", "limit": MAX_POSTGRES_PATTERN},
                )
        return await self._execute(sql, params)
