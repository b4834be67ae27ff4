"""Unquoted identifiers fold as the engines fold them: ASCII letters only.

SQLite compares names ASCII-case-insensitively and PostgreSQL lower-cases only `A`-`Z` in
an unquoted identifier (in a UTF-8 database). Python's `str.lower()` folds more: the KELVIN
SIGN (U+212A) lowers to an ASCII `k`. A gate folding with it judged a name the engine reads
as another: a CTE spelled `api_\u212aeys` hid the real `api_keys` table behind it (the gate saw
a read of the CTE), and `\u212ab_x` counted as a table of the plugin `kb_`.
"""

from __future__ import annotations

import pytest

from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason
from suaveplan_sandbox.permissions._sql_gate import SqlGate

_KELVIN = "\u212a"


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
@pytest.mark.parametrize(
    "sql",
    [
        f"WITH api_{_KELVIN}eys AS (SELECT 1 AS a) SELECT * FROM api_keys",
        f"WITH api_{_KELVIN}eys AS (SELECT 1 AS a) SELECT * FROM app_t, api_keys",
        f"WITH api_{_KELVIN}eys AS (SELECT 1 AS a) DELETE FROM app_t WHERE a IN "
        "(SELECT a FROM api_keys)",
    ],
)
def test_a_cte_whose_name_only_python_folds_to_a_table_does_not_hide_it(
    dialect: str, sql: str
) -> None:
    decision = SqlGate("app_", dialect=dialect).check_query(sql)  # type: ignore[arg-type]
    assert isinstance(decision, Deny)
    assert decision.reason is DenyReason.TABLE_OUT_OF_SCOPE


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_a_name_that_only_python_folds_onto_the_prefix_is_out_of_scope(dialect: str) -> None:
    gate = SqlGate("kb_", dialect=dialect)  # type: ignore[arg-type]
    decision = gate.check_query(f"SELECT * FROM {_KELVIN}b_x")
    assert isinstance(decision, Deny)
    assert decision.reason is DenyReason.TABLE_OUT_OF_SCOPE


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM KB_X",
        "SELECT * FROM Kb_x WHERE a IN (SELECT a FROM kB_y)",
        "WITH Tmp AS (SELECT 1 AS a) SELECT * FROM tmp, kb_x",
    ],
)
def test_ascii_case_still_folds(dialect: str, sql: str) -> None:
    assert isinstance(SqlGate("kb_", dialect=dialect).check_query(sql), Allow)  # type: ignore[arg-type]
