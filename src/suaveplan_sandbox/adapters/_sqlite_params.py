"""How `db.query(sql, params)`'s list of values binds to a SQLite statement's parameters.

The wire carries `params` as a list, and it binds by SQLite's parameter *index*: the first
value to parameter 1, and so on. That is what Python's `sqlite3` did with a sequence for
every placeholder style up to 3.13, and what plugins rely on. But for a statement with named
placeholders (`:name`, `@name`, `$name`) or, on 3.12, numbered ones (`?NNN`), `sqlite3` now
warns when it is given a sequence (an exception under `-W error`), and Python 3.14 refuses.
So such a statement is bound through a mapping from each parameter's name to the value at
its index, which every version accepts without a warning.

`sqlite3` does not expose a statement's parameter names. SQLite itself is asked, so no SQL
tokenizer of ours can disagree with it: the statement is prepared under `EXPLAIN` (which
compiles it, with the same parameters and the same authorizer calls, and runs nothing) with
a mapping that records the name `sqlite3` asks it for at each index, in index order. A
statement with a nameless `?` cannot be bound from a mapping at all; it keeps the sequence.
"""

from __future__ import annotations

import re
import sqlite3
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final, final

from suaveplan_sandbox.errors import SuaveplanError, WireValue

# A statement whose text has none of these cannot have a named or numbered parameter. A
# superset on purpose (a `:` in a string literal matches): SQLite decides, once per text.
_MAYBE_NAMED: Final = re.compile(r"[:@$]|\?[0-9]")

Bindings = tuple[WireValue, ...] | dict[str, WireValue]


@final
class _NameRecorder(dict[str, WireValue]):
    """The mapping an `EXPLAIN` probe binds from: records each name asked for, binds NULL."""

    __slots__ = ("names",)

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __getitem__(self, name: str) -> WireValue:
        self.names.append(name)
        return None


@final
class ParameterNames:
    """Each statement text's parameter names in index order (`None`: it has a nameless
    one), asked of SQLite once per text and kept for the last `cache_size` texts."""

    __slots__ = ("_cache", "_cache_size")

    def __init__(self, cache_size: int = 256) -> None:
        self._cache: OrderedDict[str, tuple[str, ...] | None] = OrderedDict()
        self._cache_size = cache_size

    def bindings(self, conn: sqlite3.Connection, sql: str, params: Sequence[WireValue]) -> Bindings:
        """What to pass `conn.execute(sql, ...)` so that `params[i]` binds parameter i + 1.

        Raises `SAND_DB_ERROR` when the values do not match the statement's parameters
        (too few or too many, or two parameters `sqlite3` would look up under one key, as
        `:a` and `@a`), before anything runs. Raises what preparing the statement raises
        (a refusal of the authorizer, a syntax error), as running it would.
        """
        if not _MAYBE_NAMED.search(sql):
            return tuple(params)
        names = self._names(conn, sql)
        if names is None:
            return tuple(params)
        if len(names) != len(params):
            raise SuaveplanError(
                "SAND_DB_ERROR",
                f"the statement takes {len(names)} parameter(s) and {len(params)} were given",
            )
        bound = dict(zip(names, params, strict=True))
        if len(bound) != len(names):
            raise SuaveplanError(
                "SAND_DB_ERROR",
                "two of the statement's parameters differ only in their prefix (as :a and "
                "@a), which Python's sqlite3 cannot bind apart",
            )
        return bound

    def _names(self, conn: sqlite3.Connection, sql: str) -> tuple[str, ...] | None:
        cache = self._cache
        if sql in cache:
            cache.move_to_end(sql)
            return cache[sql]
        recorder = _NameRecorder()
        try:
            conn.execute("EXPLAIN " + sql, recorder).close()
            names: tuple[str, ...] | None = tuple(recorder.names)
        except sqlite3.ProgrammingError:
            # "Binding N has no name": a nameless `?`, bound from the sequence as always.
            # (Any other misuse fails the same way when the statement itself is run.)
            names = None
        cache[sql] = names
        if len(cache) > self._cache_size:
            cache.popitem(last=False)
        return names
