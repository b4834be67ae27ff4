"""`FsLimits` and `SqliteLimits`: the limits `open_standard_adapters` gives the adapters it
builds, one value per host, checked when it is made (a limit that is not a positive number
is a host bug, refused before any plugin runs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from suaveplan_sandbox.adapters._fs import (
    DEFAULT_MAX_LIST_ENTRIES,
    DEFAULT_MAX_READ_BYTES,
    DEFAULT_MAX_WRITE_BYTES,
)
from suaveplan_sandbox.adapters._sqlite import (
    DEFAULT_MAX_DB_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_MAX_RESULT_COLUMNS,
    DEFAULT_MAX_RESULT_ROWS,
    DEFAULT_MAX_STATEMENT_WRITE_BYTES,
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_STATEMENT_TIMEOUT,
    positive_int_limit,
    positive_limit,
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FsLimits:
    """`BeneathRootFs`'s limits (see it): `max_root_bytes=None` is no quota."""

    max_read_bytes: int = DEFAULT_MAX_READ_BYTES
    max_write_bytes: int = DEFAULT_MAX_WRITE_BYTES
    max_list_entries: int = DEFAULT_MAX_LIST_ENTRIES
    max_root_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_read_bytes", "max_write_bytes", "max_list_entries"):
            positive_int_limit(getattr(self, name), name, "FsLimits")
        if self.max_root_bytes is not None:
            positive_int_limit(self.max_root_bytes, "max_root_bytes", "FsLimits")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SqliteLimits:
    """`SqliteDb`'s limits (see it)."""

    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT
    max_result_rows: int = DEFAULT_MAX_RESULT_ROWS
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    max_result_columns: int = DEFAULT_MAX_RESULT_COLUMNS
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    max_db_bytes: int = DEFAULT_MAX_DB_BYTES
    max_statement_write_bytes: int = DEFAULT_MAX_STATEMENT_WRITE_BYTES

    def __post_init__(self) -> None:
        positive_limit(self.statement_timeout, "statement_timeout", "SqliteLimits")
        for name in (
            "max_result_rows",
            "max_result_bytes",
            "max_result_columns",
            "max_value_bytes",
            "max_db_bytes",
            "max_statement_write_bytes",
        ):
            positive_int_limit(getattr(self, name), name, "SqliteLimits")
