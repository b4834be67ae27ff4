"""PostgreSQL as the oracle for the SQL gate's `postgres` dialect: does the engine agree?

`running_postgres()` starts a throw-away PostgreSQL 15 cluster (unix socket only, no TCP); a
`PostgresOracle` on it creates prefixed tables that a role `oracle_guest` may use, and decoys
(`users`, `secrets`, ...) it may not. `violations(sql)` runs `sql` as that role inside a
transaction that is always rolled back; a permission error (SQLSTATE 42501) means the
statement reached an object outside the prefix, which is a finding when the gate allowed it.
Other errors (syntax the gate accepts but PostgreSQL does not, a missing column) are not
findings: they touch nothing.

Limits, by construction: objects PUBLIC may read (most of `pg_catalog`) raise no permission
error, so a catalog read is not seen here; the SQLite oracle and the gate's own vectors cover
those.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final, final

import psycopg
from psycopg import pq, sql

__all__ = ["DECOYS", "PG_BIN", "PREFIX", "PostgresOracle", "running_postgres"]

PG_BIN: Final = Path("/usr/lib/postgresql/15/bin")
PREFIX: Final = "billing_"
DECOYS: Final = ("users", "secrets", "a", "b", "t", "u", "r", "x")
_PREFIXED: Final = ("billing_x", "billing_y")
_GUEST: Final = "oracle_guest"
_COLUMNS: Final = "(id integer primary key, a integer unique, b integer, c text, name text)"


@contextlib.contextmanager
def running_postgres(port: int = 54331) -> Iterator[str]:
    """A throw-away cluster as the `postgres` OS user, socket in a temp dir: its conninfo."""
    if not (PG_BIN / "initdb").exists():
        raise RuntimeError("PostgreSQL 15 is not installed at /usr/lib/postgresql/15/bin")
    tmp = Path(tempfile.mkdtemp(prefix="suaveplan-pg-oracle-"))
    shutil.chown(tmp, "postgres")
    data = tmp / "data"
    run = ["runuser", "-u", "postgres", "--"]
    subprocess.run(  # noqa: S603 — the installed PostgreSQL's own tools
        [*run, str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "admin"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    options = f"-k {tmp} -c listen_addresses='' -p {port}"
    subprocess.run(  # noqa: S603 — the installed PostgreSQL's own tools
        [*run, str(PG_BIN / "pg_ctl"), "-D", str(data), "-w", "-l", str(tmp / "log"),
         "-o", options, "start"],
        check=True,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield f"host={tmp} port={port} user=admin dbname=postgres"
    finally:
        subprocess.run(  # noqa: S603 — the installed PostgreSQL's own tools
            [*run, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            check=False,
            stdout=subprocess.DEVNULL,
        )
        shutil.rmtree(tmp, ignore_errors=True)


@final
class PostgresOracle:
    """One admin connection; each statement runs as `oracle_guest` and is rolled back."""

    __slots__ = ("_conn",)

    def __init__(self, conninfo: str) -> None:
        self._conn = psycopg.connect(conninfo, autocommit=True)
        ident = sql.Identifier
        with self._conn.cursor() as cur:
            cur.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident(_GUEST)))
            cur.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(ident(_GUEST)))
            for name in (*_PREFIXED, *DECOYS):
                cur.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(ident(name)))
                cur.execute(sql.SQL("CREATE TABLE {} " + _COLUMNS).format(ident(name)))
            for name in _PREFIXED:
                cur.execute(sql.SQL("GRANT ALL ON {} TO {}").format(ident(name), ident(_GUEST)))

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> PostgresOracle:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def violations(self, statement: str) -> list[str]:
        """Permission errors PostgreSQL raises running `statement` as the guest role.

        Sent with libpq's extended protocol (`exec_params`): `$N` parameters are bound (to
        NULL) by the server, and more than one statement is refused as it is by the gate.
        """
        if "\x00" in statement:
            return ["holds a NUL, which libpq reads as the end of the statement"]
        pg = self._conn.pgconn
        params: list[bytes | None] = [None] * _highest_parameter(statement)
        _ok(pg.exec_(b"BEGIN"))
        try:
            _ok(pg.exec_(b"SET LOCAL ROLE " + _GUEST.encode()))
            _ok(pg.exec_(b"SET LOCAL statement_timeout = '2s'"))
            result = pg.exec_params(statement.encode("utf-8"), params)
        finally:
            pg.exec_(b"ROLLBACK")
        if result.status != pq.ExecStatus.FATAL_ERROR:
            return []
        state = result.error_field(pq.DiagnosticField.SQLSTATE) or b""
        if state != _INSUFFICIENT_PRIVILEGE:
            return []  # not valid PostgreSQL, or a runtime error: nothing was reached
        message = result.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or b""
        return [f"permission error: {message.decode('utf-8', 'replace')}"]


_INSUFFICIENT_PRIVILEGE: Final = b"42501"
_PARAMETER: Final = re.compile(r"\$([0-9]{1,4})")


def _highest_parameter(statement: str) -> int:
    return max((int(m) for m in _PARAMETER.findall(statement)), default=0)


def _ok(result: pq.abc.PGresult) -> None:
    if result.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
        raise RuntimeError(f"oracle setup statement failed: {result.error_message!r}")
