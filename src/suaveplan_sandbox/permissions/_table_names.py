"""Table-name prefixes the database engines keep for themselves.

Under `pg_` every PostgreSQL catalog view a query names unqualified (`pg_roles`,
`pg_settings`, `pg_stat_activity`) would fall in a plugin's scope, and under `sqlite_`
SQLite's own tables; and no plugin table could be reached by either name (PostgreSQL searches
`pg_catalog` first; SQLite refuses to create `sqlite_*` tables). The manifest, which is the
plugin's own, may not declare such a `tablePrefix`, and the SQL gate never counts such a name
as a plugin's table whatever prefix it was built with.
"""

from __future__ import annotations

from typing import Final

RESERVED_TABLE_PREFIXES: Final = ("pg_", "sqlite_")
