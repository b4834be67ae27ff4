"""The db gate: one sqlglot parse, one allowlist walk, a bounded LRU cache by SQL text.

Fail closed: the walk accepts only expression types listed in `_QUERY_NODES` (plus functions
named in the dialect's allowlist); anything else — a sqlglot `Command` fallback, a node type
nobody reviewed, a parse error — is `statement-not-permitted`.

A decision runs on the caller's thread (the host's event loop) and sqlglot spends about ten
microseconds and a few hundred bytes a token, so a runtime query longer than
`max_sql_length` characters is refused before it is tokenized: without a limit one frame of
`SELECT 1,1,1,…` held the loop for minutes and gigabytes.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Final, Literal, final

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ErrorLevel
from sqlglot.tokenizer_core import Token, TokenType

from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason
from suaveplan_sandbox.permissions._table_names import RESERVED_TABLE_PREFIXES

_CAP: Final = "db"
_NOT_PERMITTED: Final = Deny(capability=_CAP, reason=DenyReason.STATEMENT_NOT_PERMITTED)
_OUT_OF_SCOPE: Final = Deny(capability=_CAP, reason=DenyReason.TABLE_OUT_OF_SCOPE)
_MALFORMED: Final = Deny(capability=_CAP, reason=DenyReason.MALFORMED_PAYLOAD)

# Real engine function names (what the sqlite3 authorizer sees as SQLITE_FUNCTION arg2).
_COMMON_FUNCTIONS: Final = frozenset(
    {
        # aggregates and window functions
        "count", "sum", "avg", "min", "max", "row_number", "rank", "dense_rank", "lag", "lead",
        "first_value", "last_value", "ntile", "percent_rank", "cume_dist", "nth_value",
        # conditionals
        "coalesce", "nullif",
        # strings
        "lower", "upper", "length", "substr", "substring", "trim", "ltrim", "rtrim", "replace",
        "concat", "concat_ws", "reverse",
        # math
        "abs", "round", "ceil", "ceiling", "floor", "sign", "sqrt", "pow", "power", "exp",
        "ln", "log", "mod", "random",
    }
)  # fmt: skip

SQLITE_SAFE_FUNCTIONS: Final[frozenset[str]] = _COMMON_FUNCTIONS | frozenset(
    {"total", "group_concat", "string_agg", "ifnull", "iif", "instr", "char", "unicode",
     "hex", "unhex", "quote", "printf", "date", "time", "datetime", "julianday", "strftime",
     "unixepoch", "timediff", "json", "json_extract", "json_array", "json_object", "json_type",
     "json_valid", "json_quote", "json_array_length", "json_group_array",
     "json_group_object", "typeof", "randomblob", "zeroblob", "changes", "last_insert_rowid",
     "like", "glob", "likelihood", "likely", "unlikely", "octet_length", "->", "->>", "format"}
)  # fmt: skip
# Not `format` on PostgreSQL: its width (`%1000000000s`, or `%*s` from an argument) pads in
# one loop that no statement timeout interrupts (1 GB and 7 s past a 100 ms timeout). Nor
# `lpad`/`rpad`, for the same reason: a length of 268,000,000 allocates 1 GB and fills it in
# one loop (3.5 s past a 100 ms timeout, and each further call in the expression adds as
# much, memory included). sqlglot parses both into `Pad`, which no list names either.
POSTGRES_SAFE_FUNCTIONS: Final[frozenset[str]] = _COMMON_FUNCTIONS | frozenset(
    {"string_agg", "array_agg", "bool_and", "bool_or", "greatest", "least", "now",
     "date_trunc", "extract", "to_char", "left", "right", "btrim",
     "char_length", "position", "strpos", "md5", "split_part", "json_build_object",
     "jsonb_build_object", "json_build_array", "jsonb_build_array", "jsonb_extract_path_text",
     "json_extract_path_text", "json_array_length", "jsonb_array_length", "json_agg",
     "jsonb_agg", "current_date", "current_time", "current_timestamp"}
)  # fmt: skip

# sqlglot parses many functions into its own classes; these are their `sql_name()`s, lower
# case, for constructs that are safe in both dialects (casts, CASE, JSON paths, date format).
_SQLGLOT_SAFE_NAMES: Final = frozenset(
    {"cast", "try_cast", "case", "if", "exists", "current_date", "current_time",
     "current_timestamp", "str_position", "time_to_str", "ts_or_ds_to_timestamp",
     "time_str_to_time", "str_to_time", "json_extract_scalar", "json_extract",
     "j_s_o_n_object", "j_s_o_n_array_agg", "json_array", "json_object", "rand", "chr",
     "timestamp_trunc", "date_trunc", "j_s_o_n_b_extract", "j_s_o_n_b_extract_scalar",
     "array_agg", "group_concat", "strposition", "ceil", "ln", "pow", "string_agg",
     "logical_and", "logical_or", "greatest", "least", "substring", "length", "nullif"}
)  # fmt: skip
_SQLITE_GATE_NAMES: Final = SQLITE_SAFE_FUNCTIONS | _SQLGLOT_SAFE_NAMES
_POSTGRES_GATE_NAMES: Final = POSTGRES_SAFE_FUNCTIONS | _SQLGLOT_SAFE_NAMES

# Type names sqlglot does not know (`DataType.Type.USERDEFINED`) that a postgres cast may
# name: PostgreSQL resolves any other through the search path, `pg_catalog` included, and
# some input functions look names up (`'{public.t}'::_regclass` tells whether the host has
# that table, `'x=r/y'::aclitem` whether a role exists). None of these looks anything up.
_POSTGRES_USER_TYPES: Final = frozenset(
    {"cidr", "macaddr", "macaddr8", "varbit", "tsvector", "tsquery", "jsonpath", "line",
     "box", "path", "polygon", "circle"}
)  # fmt: skip

# PostgreSQL's `btrim`/`ltrim`/`rtrim`/`trim(... FROM ...)` scan the set of characters once
# per character trimmed, in a loop no statement timeout interrupts (two 200,000-character
# values: 167 s past a 100 ms timeout): the set must be a string literal this short.
MAX_POSTGRES_TRIM_SET: Final = 32
# The same for LIKE/ILIKE (the pattern) and `strpos`/`position`/`replace`/`split_part` (the
# needle): the time is the text's length times this operand's (a 200,000-character pattern,
# 78 s past a 100 ms timeout). The operand must be built of string literals, at most this
# many characters in all, and parameters, which `PostgresDb` bounds to this length too
# (`SqlGate.bounded_parameters`). SQLite limits LIKE patterns itself (1,000 bytes).
MAX_POSTGRES_PATTERN: Final = 1000
# Node type -> the argument whose length multiplies its cost (see above).
_POSTGRES_PATTERN_ARGS: Final[dict[type[exp.Expr], str]] = {
    exp.Like: "expression",
    exp.ILike: "expression",
    exp.StrPosition: "substr",
    exp.Replace: "expression",
    exp.SplitPart: "delimiter",
}
_MAYBE_PATTERN: Final = re.compile(r"like|strpos|position|replace|split_part", re.IGNORECASE)


def _pattern_parts(operand: object) -> list[exp.Expr]:
    """The literals and parameters a pattern operand is built of (concatenated with `||` or
    `concat`); raises `_Rejected` for anything else: a column, a function, a subquery."""
    parts: list[exp.Expr] = []
    stack: list[object] = [operand]
    while stack:
        item = stack.pop()
        kind = type(item)
        if not isinstance(item, exp.Expr):
            raise _Rejected
        string = kind is exp.Literal and isinstance(item, exp.Literal) and item.is_string
        if string or kind is exp.Parameter or kind is exp.Placeholder:
            parts.append(item)
        elif kind is exp.DPipe:
            stack += [item.this, item.expression]
        elif kind is exp.Paren:
            stack.append(item.this)
        elif kind is exp.Concat:
            stack += item.expressions
        else:
            raise _Rejected
    return parts


_SYSTEM_NAMES: Final = frozenset(
    {"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema",
     "sqlite_sequence", "sqlite_stat1", "sqlite_stat4", "pg_catalog", "information_schema",
     "sqlite_dbpage", "sqlite_dbstat", "dbstat"}
)  # fmt: skip


def _is_system_name(name: str) -> bool:
    """An engine's own table, view or schema: never a plugin's, whatever its prefix (the
    manifest refuses the reserved prefixes; a gate built without one still refuses these)."""
    lowered = name.lower()
    return lowered in _SYSTEM_NAMES or lowered.startswith(RESERVED_TABLE_PREFIXES)


_ROOTS: Final = (exp.Select, exp.Union, exp.Intersect, exp.Except, exp.Insert, exp.Update,
                 exp.Delete)  # fmt: skip

# Reviewed structural node types (functions are reviewed by name, not here).
_QUERY_NODES: Final[frozenset[type[exp.Expr]]] = frozenset(
    {
        exp.Select, exp.Union, exp.Intersect, exp.Except, exp.Insert, exp.Update, exp.Delete,
        exp.With, exp.CTE, exp.TableAlias, exp.Subquery, exp.From, exp.Join, exp.Where,
        exp.Group, exp.Having, exp.Order, exp.Ordered, exp.Limit, exp.Offset, exp.Column,
        exp.Identifier, exp.Star, exp.Literal, exp.Null, exp.Boolean, exp.Alias, exp.Table,
        exp.Tuple, exp.Paren, exp.And, exp.Or, exp.Not, exp.EQ, exp.NEQ, exp.GT, exp.GTE,
        exp.LT, exp.LTE, exp.Is, exp.In, exp.Between, exp.Like, exp.ILike, exp.Glob,
        exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Neg, exp.BitwiseAnd, exp.BitwiseOr,
        exp.BitwiseXor, exp.BitwiseNot, exp.BitwiseLeftShift, exp.BitwiseRightShift, exp.DPipe,
        exp.Placeholder, exp.Parameter, exp.HexString, exp.Distinct, exp.Window, exp.WindowSpec,
        exp.Returning, exp.OnConflict, exp.Values, exp.Schema, exp.DataType, exp.Escape,
        exp.Collate, exp.Exists, exp.Any, exp.All, exp.NullSafeEQ, exp.NullSafeNEQ,
        exp.Lateral, exp.Var, exp.Interval, exp.Filter,
        exp.PrimaryKeyColumnConstraint, exp.RawString, exp.JSONPath, exp.JSONPathRoot,
        exp.JSONPathKey, exp.JSONPathSubscript, exp.JSONKeyValue,
    }
)  # fmt: skip

_DDL_NODES: Final[frozenset[type[exp.Expr]]] = _QUERY_NODES | frozenset(
    {
        exp.Create, exp.Drop, exp.Alter, exp.ColumnDef, exp.ColumnConstraint,
        exp.NotNullColumnConstraint, exp.DefaultColumnConstraint, exp.UniqueColumnConstraint,
        exp.CheckColumnConstraint, exp.AutoIncrementColumnConstraint, exp.Index,
        exp.IndexParameters, exp.Reference, exp.ForeignKey, exp.PrimaryKey, exp.Constraint,
        exp.RenameColumn, exp.AlterRename, exp.AlterColumn, exp.Properties, exp.DataTypeParam,
        exp.CollateColumnConstraint, exp.DateFormatColumnConstraint,
    }
)  # fmt: skip
_DDL_KINDS: Final = frozenset({"TABLE", "INDEX", "VIEW"})
_DML_ROOTS: Final = _ROOTS

_DML_KINDS: Final = frozenset({exp.Insert, exp.Update, exp.Delete})
_DML_TARGET_KEYS: Final = ("this", "tables")
# Every node type that may carry `with_`, name a table or a DML target (see `_Walk.scoped`).
_SCOPED_NODES: Final[frozenset[type[exp.Expr]]] = frozenset(
    {kind for kind in _DDL_NODES if "with_" in kind.arg_types}
    | {exp.Table, exp.In, exp.CTE, *_DML_KINDS}
)
# About a fifth of a second of parsing at the worst (a token every two characters, as in
# `SELECT 1,1,…`) on a 2-core CI machine; twice as long at twice the length.
DEFAULT_MAX_SQL_LENGTH: Final = 16 * 1024
_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_FUNC_NAMES: dict[type[exp.Expr], str] = {}  # sqlglot function class -> its `sql_name()`

logger = logging.getLogger(__name__)


@final
class _QuietWhileGating(logging.Filter):
    """Drops the records sqlglot logs while this thread runs the gate.

    They quote the plugin's text (`Invalid JSON path syntax. … $[<text>`, `'<text>' contains
    unsupported syntax`): text the host's redaction never sees, in the host's log, as often
    as a plugin sends a new statement. The gate's decision says all the host needs."""

    def __init__(self) -> None:
        super().__init__("sqlglot")
        self._gating = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self._gating, "depth", 0)

    @contextlib.contextmanager
    def gating(self) -> Iterator[None]:
        self._gating.depth = getattr(self._gating, "depth", 0) + 1
        try:
            yield
        finally:
            self._gating.depth -= 1


_QUIET: Final = _QuietWhileGating()
logging.getLogger("sqlglot").addFilter(_QUIET)


class _Rejected(Exception):
    """Internal: the walk found a statement-level problem."""


@final
class _Walk:
    """One pass over a parsed statement: tables with CTE scoping, node and function allowlist."""

    __slots__ = (
        "bounded_operands",
        "functions",
        "nodes",
        "prefix",
        "tables",
        "unscoped",
        "user_types",
    )

    def __init__(
        self,
        prefix: str | None,
        functions: frozenset[str],
        nodes: frozenset[type[exp.Expr]],
        user_types: frozenset[str] | Literal["any"],
        *,
        bounded_operands: bool = False,
    ) -> None:
        self.prefix = prefix
        self.functions = functions
        self.nodes = nodes
        self.user_types = user_types
        self.bounded_operands = bounded_operands
        self.tables: set[str] = set()
        self.unscoped = False

    def name_in_scope(self, name: str) -> bool:
        return bool(self.prefix) and name.startswith(self.prefix or "\x00")

    def identifier(self, ident: object) -> str:
        if not isinstance(ident, exp.Identifier):
            raise _Rejected
        text = ident.this
        if not isinstance(text, str):
            raise _Rejected
        # The engines fold an unquoted name's ASCII letters only; `str.lower()` would also
        # fold U+212A (KELVIN SIGN) to `k` and judge a name the engine reads as another.
        return text if ident.quoted else text.translate(_ASCII_LOWER)

    def table(self, node: exp.Table, ctes: frozenset[str]) -> None:
        if node.args.get("db") is not None or node.args.get("catalog") is not None:
            raise _Rejected
        self.table_name(self.identifier(node.this), ctes)

    def in_table(self, field: exp.Column, ctes: frozenset[str]) -> None:
        """SQLite's `expr IN table-name`: sqlglot parses the name as a column, SQLite reads
        the table (found by fuzzing against SQLite's authorizer)."""
        if any(field.args.get(k) is not None for k in ("table", "db", "catalog")):
            raise _Rejected
        self.table_name(self.identifier(field.this), ctes)

    def table_name(self, name: str, ctes: frozenset[str]) -> None:
        if _is_system_name(name):
            raise _Rejected
        if name in ctes:
            return
        self.tables.add(name)
        if not self.name_in_scope(name):
            self.unscoped = True

    def function(self, node: exp.Func) -> None:
        kind = type(node)
        if kind is exp.Anonymous:
            name = node.name.lower()
        else:
            name = _FUNC_NAMES.get(kind) or _FUNC_NAMES.setdefault(kind, node.sql_name().lower())
        if name not in self.functions:
            raise _Rejected
        if self.bounded_operands:
            self.bounded_operand(node, kind)

    def bounded_operand(self, node: exp.Expr, kind: type[exp.Expr]) -> None:
        """PostgreSQL: the operand whose length multiplies the cost of `node` is short."""
        if kind is exp.Trim:
            chars = node.args.get("expression")
            if chars is not None and not (
                isinstance(chars, exp.Literal)
                and chars.is_string
                and len(chars.this) <= MAX_POSTGRES_TRIM_SET
            ):
                raise _Rejected
            return
        arg = _POSTGRES_PATTERN_ARGS.get(kind)
        if arg is None:
            return
        parts = _pattern_parts(node.args.get(arg))
        literal = sum(len(p.this) for p in parts if isinstance(p, exp.Literal))
        if literal > MAX_POSTGRES_PATTERN:
            raise _Rejected

    def visit(self, node: exp.Expr, ctes: frozenset[str]) -> None:
        # The hot path: most nodes need only the allowlist and their children. This is the
        # gate's share of a decision's cost next to sqlglot's parse, so it stays lean: no
        # `find_all`, no copies, one visit per node.
        kind = type(node)
        if kind in _SCOPED_NODES:
            self.scoped(node, kind, ctes)
            return
        if kind not in self.nodes:
            if not isinstance(node, exp.Func):
                raise _Rejected
            self.function(node)
        elif kind is exp.Column:
            args = node.args
            if args.get("db") is not None or args.get("catalog") is not None:
                raise _Rejected
        elif kind is exp.DataType and node.this is exp.DataType.Type.USERDEFINED:
            self.user_type(node)
        elif (kind is exp.Like or kind is exp.ILike) and self.bounded_operands:
            self.bounded_operand(node, kind)
        for child in node.args.values():
            if isinstance(child, exp.Expr):
                self.visit(child, ctes)
            elif type(child) is list:
                self.children(child, ctes)

    def user_type(self, node: exp.Expr) -> None:
        if self.user_types == "any":
            return
        kind = node.args.get("kind")
        if not isinstance(kind, exp.Identifier) or kind.quoted:
            raise _Rejected
        if self.identifier(kind) not in self.user_types:
            raise _Rejected

    def scoped(self, node: exp.Expr, kind: type[exp.Expr], ctes: frozenset[str]) -> None:
        """Nodes that name tables, open a WITH scope or carry a DML target."""
        if kind not in self.nodes:
            if not isinstance(node, exp.Func):
                raise _Rejected
            self.function(node)
        with_ = node.args.get("with_") if kind is not exp.CTE else None
        if isinstance(with_, exp.With):
            ctes = self.with_clause(with_, ctes)
        if kind is exp.Table:
            assert isinstance(node, exp.Table)
            self.table(node, ctes)
            for key, child in node.args.items():
                if key not in ("this", "db", "catalog"):
                    self.children(child, ctes)
            return
        skip_field = False
        if kind is exp.In:
            field = node.args.get("field")
            if isinstance(field, exp.Column):
                self.in_table(field, ctes)
                skip_field = True
        # A DML target is always a real table, even when a CTE of the same name is in scope
        # (`WITH users AS (...) DELETE FROM users` deletes from the real `users`).
        targets = _DML_TARGET_KEYS if kind in _DML_KINDS else ()
        for key, child in node.args.items():
            if child is with_ and with_ is not None:
                continue
            if key == "_type" or (skip_field and key == "field"):
                continue
            self.children(child, frozenset() if key in targets else ctes)

    def with_clause(self, with_: exp.With, ctes: frozenset[str]) -> frozenset[str]:
        recursive = bool(with_.args.get("recursive"))
        for cte in with_.expressions:
            if not isinstance(cte, exp.CTE):
                raise _Rejected
            alias = cte.args.get("alias")
            if not isinstance(alias, exp.TableAlias):
                raise _Rejected
            name = self.identifier(alias.this)
            # A CTE sees earlier siblings, and itself only under RECURSIVE.
            body_scope = ctes | {name} if recursive else ctes
            for key, child in cte.args.items():
                if key == "alias":
                    for col in alias.args.get("columns") or ():
                        self.children(col, body_scope)
                    continue
                self.children(child, body_scope)
            ctes = ctes | {name}
        return ctes

    def children(self, child: object, ctes: frozenset[str]) -> None:
        if isinstance(child, exp.Expr):
            self.visit(child, ctes)
        elif isinstance(child, list):
            for item in child:
                if isinstance(item, exp.Expr):
                    self.visit(item, ctes)
                elif item is not None and not isinstance(item, (str, bool, int)):
                    raise _Rejected


_CONFLICT_ACTIONS: Final = frozenset({"rollback", "abort", "replace", "fail", "ignore"})
# Text that may hold one of the spellings `_sqlite_spellings` handles; a superset on purpose.
_MAYBE_SQLITE_SPELLING: Final = re.compile(r"\?[0-9]|replace|update", re.IGNORECASE)


def _sqlite_spellings(tokens: list[Token], sql: str) -> str | None:
    """`sql` respelled where SQLite has a synonym sqlglot cannot parse, else None.

    Each respelling keeps what the statement reads and writes: `?NNN` (a numbered parameter)
    becomes `?`; `UPDATE OR <action>` becomes `UPDATE` (the conflict action only picks what
    happens to clashing rows of the target itself); `REPLACE INTO` becomes `INSERT OR
    REPLACE INTO`, which SQLite documents as the same statement. The caller still decides
    on the original text. Raises `_Rejected` for `?` glued to a non-integer.
    """
    edits: list[tuple[int, int, str]] = []  # (start, end exclusive, replacement)
    count = len(tokens)
    for i, token in enumerate(tokens):
        kind = token.token_type
        if kind is TokenType.PLACEHOLDER and i + 1 < count:
            nxt = tokens[i + 1]
            if nxt.token_type is TokenType.NUMBER and nxt.start == token.end + 1:
                if not (nxt.text.isascii() and nxt.text.isdigit()):
                    raise _Rejected
                edits.append((nxt.start, nxt.end + 1, ""))
        elif (
            kind is TokenType.UPDATE and i + 2 < count and tokens[i + 1].token_type is TokenType.OR
        ):
            action = tokens[i + 2]
            if action.text.lower() not in _CONFLICT_ACTIONS:
                raise _Rejected
            edits.append((tokens[i + 1].start, action.end + 1, ""))
        elif kind is TokenType.REPLACE and (
            i == 0 or (tokens[i - 1].token_type is not TokenType.OR and i + 1 < count
                       and tokens[i + 1].token_type is TokenType.INTO)
        ):  # fmt: skip
            # At the start sqlglot's tokenizer reads `REPLACE` as a command and swallows the
            # rest into one string; after a WITH clause it stays a keyword before INTO.
            edits.append((token.start, token.end + 1, "INSERT OR REPLACE"))
    if not edits:
        return None
    out: list[str] = []
    pos = 0
    for start, end, text in edits:
        out.append(sql[pos:start])
        out.append(text)
        pos = end
    out.append(sql[pos:])
    return "".join(out)


# -- lexical agreement with the engine ---------------------------------------------------
#
# sqlglot's tokenizer is not the engine's: it read `$1,$ … $1,$` as a dollar-quoted string
# where PostgreSQL reads the parameters `$1`, `$2` and code (PostgreSQL's tags are
# identifiers, sqlglot's anything up to the next `$`), and counted `*/*` inside a nested
# comment as a close and an open where PostgreSQL reads a close and a `*`. Either way the
# gate judged less code than the engine ran (a hidden `set_config('statement_timeout', …)`,
# a read of `pg_roles`). So every statement is also read by a small scanner that follows the
# engine's own lexer (PostgreSQL's scan.l with `standard_conforming_strings = on`, which the
# adapter pins; SQLite's tokenize.c) for what hides text from a parser: whitespace, comments,
# string and blob literals, quoted identifiers, dollar quotes and SQLite's parameter names.
# The statement is refused unless every literal the engine reads is one sqlglot token of the
# same extent, and every character the engine reads as code lies in a token sqlglot reads as
# code. Where the two agree on that, a difference left between them (how code is cut into
# tokens) cannot hide code from the gate.

_ENGINE_IDENT_START: Final = r"A-Za-z_\u0080-\U0010ffff"
_ENGINE_IDENT_CONT: Final = r"A-Za-z0-9_$\u0080-\U0010ffff"
_POSTGRES_LEXEME: Final = re.compile(
    r"(?P<space>[ \t\n\r\f\v]+)"
    r"|(?P<line>--[^\n\r]*)"
    r"|(?P<block>/\*)"
    r"|(?P<escape>[eE]')"  # E'…': backslash escapes
    r"|(?P<plain>(?:[uU]&|[nN])?')"  # '…', U&'…', N'…': a quote is doubled
    r"|(?P<bits>[bBxX]')"  # B'…', X'…': no escapes at all
    r"|(?P<quoted>(?:[uU]&)?\")"
    rf"|(?P<ident>[{_ENGINE_IDENT_START}][{_ENGINE_IDENT_CONT}]*)"
    rf"|(?P<dollar>\$(?:[{_ENGINE_IDENT_START}][A-Za-z0-9_\u0080-\U0010ffff]*)?\$)"
    r"|(?P<code>\$[0-9]+|[^ \t\n\r\f\v\-/'\"$" + _ENGINE_IDENT_START + r"]+|.)",
    re.DOTALL,
)
_POSTGRES_BODY: Final = {
    "escape": re.compile(r"(?:[^'\\]|\\.|'')*'", re.DOTALL),
    "plain": re.compile(r"(?:[^']|'')*'"),
    "bits": re.compile(r"[^']*'"),
    "quoted": re.compile(r'(?:[^"]|"")*"'),
}
# After a closing quote: whitespace holding a newline, then a quote, continues the literal in
# the same state (scan.l's `quotecontinue`), so an `E'…'` continues with backslash escapes.
# Possessive throughout (`*+`): the plugin writes this text, and the backtracking of a
# `(?:[ \t…]+|…)*` over a run of whitespace with no quote after it doubled with every
# character (0.8 s for 24 spaces).
_POSTGRES_CONTINUE: Final = re.compile(
    r"(?:[ \t\f]|--[^\n\r]*+)*+[\n\r](?:[ \t\n\r\f\v]|--[^\n\r]*+[\n\r])*+'"
)
# Inside a comment `/*` opens and `*/` closes: the same as scan.l's `\*+\/` (a run of stars
# then a slash is a close, whichever star starts it), without rescanning a run of stars from
# each of its positions (quadratic in the run).
_POSTGRES_COMMENT_MARK: Final = re.compile(r"/\*|\*/")

_SQLITE_LEXEME: Final = re.compile(
    r"(?P<space>[ \t\n\f\r]+)"
    r"|(?P<line>--[^\n]*)"
    r"|(?P<block>/\*(?=.))"
    r"|(?P<bits>[xX]')"  # a BLOB literal ends at its first quote
    r"|(?P<plain>')"
    r"|(?P<quoted>[\"`])"
    r"|(?P<bracket>\[)"
    rf"|(?P<ident>[{_ENGINE_IDENT_START}][{_ENGINE_IDENT_CONT}]*)"
    r"|(?P<variable>[$@:#])"
    r"|(?P<code>[^ \t\n\f\r\-/'\"`\[$@:#" + _ENGINE_IDENT_START + r"]+|.)",
    re.DOTALL,
)
_SQLITE_BODY: Final = {
    "plain": re.compile(r"(?:[^']|'')*'"),
    "bits": re.compile(r"[^']*'"),
    '"': re.compile(r'(?:[^"]|"")*"'),
    "`": re.compile(r"(?:[^`]|``)*`"),
    "bracket": re.compile(r"[^\]]*\]"),
}
_SQLITE_ID_CHAR: Final = re.compile(rf"[{_ENGINE_IDENT_CONT}]")
_LITERAL_TOKENS: Final = frozenset(
    {TokenType.STRING, TokenType.IDENTIFIER, TokenType.BIT_STRING, TokenType.HEX_STRING,
     TokenType.BYTE_STRING, TokenType.NATIONAL_RAW_STRING, TokenType.NATIONAL_STRING,
     TokenType.RAW_STRING, TokenType.HEREDOC_STRING, TokenType.UNICODE_STRING}
)  # fmt: skip


def _sqlite_variable_end(sql: str, start: int) -> int:
    """Where SQLite's parameter token starting at `start` (`$`, `@`, `:` or `#`) ends; the
    TCL forms `$a::b` and `$a(…)` included (tokenize.c). -1 for SQLite's TK_ILLEGAL."""
    size = len(sql)
    i = start + 1
    named = 0
    while i < size:
        char = sql[i]
        if _SQLITE_ID_CHAR.match(char):
            named += 1
            i += 1
        elif char == "(" and named:
            i += 1
            while i < size and sql[i] not in " \t\n\f\r\v)":
                i += 1
            return i + 1 if i < size and sql[i] == ")" else -1
        elif char == ":" and sql[i + 1 : i + 2] == ":":
            i += 2
        else:
            break
    return i if named else -1


def _engine_lexemes(
    sql: str, dialect: str
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]] | None:
    """(literal spans, code spans) as the engine reads `sql`, each `(start, end exclusive)`:
    literals are strings, BLOBs, quoted identifiers and dollar quotes (their delimiters
    included); code is every other character outside whitespace and comments. None where the
    engine would refuse the text itself (an unterminated literal or PostgreSQL comment)."""
    postgres = dialect == "postgres"
    lexeme = _POSTGRES_LEXEME if postgres else _SQLITE_LEXEME
    literals: list[tuple[int, int]] = []
    code: list[tuple[int, int]] = []
    pos, size = 0, len(sql)
    while pos < size:
        match = lexeme.match(sql, pos)
        if match is None:  # pragma: no cover - `.` matches any character
            return None
        kind, end = match.lastgroup, match.end()
        if kind == "block":
            end = _block_comment_end(sql, end, postgres)
            if end < 0:
                return None
        elif kind in ("escape", "plain", "bits", "quoted", "bracket"):
            key = sql[end - 1] if kind == "quoted" and not postgres else kind
            body = (_POSTGRES_BODY if postgres else _SQLITE_BODY)[key]
            while True:
                closed = body.match(sql, end)
                if closed is None:
                    return None
                end = closed.end()
                more = _POSTGRES_CONTINUE.match(sql, end) if postgres and kind != "quoted" else None
                if more is None:
                    break
                literals.append((pos, end))
                pos, end = more.end() - 1, more.end()
            literals.append((pos, end))
        elif kind == "dollar":
            close = sql.find(match.group(), end)
            if close < 0:
                return None
            end = close + len(match.group())
            literals.append((pos, end))
        elif kind == "variable":
            end = _sqlite_variable_end(sql, pos)
            if end < 0:
                return None
        if kind in ("ident", "code", "variable"):
            if code and code[-1][1] == pos:
                code[-1] = (code[-1][0], end)
            else:
                code.append((pos, end))
        pos = end
    return literals, code


def _block_comment_end(sql: str, pos: int, nested: bool) -> int:
    """The end of a block comment whose `/*` ends at `pos`: PostgreSQL nests them (scan.l's
    `xc` state: `/*` opens, a run of `*` then `/` closes, so `*/*` is a close and a `*`);
    SQLite does not, and an unterminated one runs to the end. -1: PostgreSQL's
    unterminated comment, an error."""
    if not nested:
        close = sql.find("*/", pos)
        return len(sql) if close < 0 else close + 2
    depth = 1
    while depth:
        mark = _POSTGRES_COMMENT_MARK.search(sql, pos)
        if mark is None:
            return -1
        depth += 1 if mark.group() == "/*" else -1
        pos = mark.end()
    return pos


def _lexically_agrees(sql: str, tokens: list[Token], dialect: str) -> bool:
    """Whether sqlglot's `tokens` of `sql` hide no code from the gate that the engine runs
    (see the comment above `_ENGINE_IDENT_START`)."""
    lexemes = _engine_lexemes(sql, dialect)
    if lexemes is None:
        return False
    literals, code = lexemes
    literal_tokens: dict[int, int] = {}
    spans: list[tuple[int, int]] = []
    for token in tokens:
        start, end = token.start, token.end + 1
        kind = token.token_type
        if kind is TokenType.HINT:
            continue  # a comment (`/*+ … */`) to the engine, never code
        if kind in _LITERAL_TOKENS and not "0" <= sql[start : start + 1] <= "9":
            # (`0x1F` is a HEX_STRING to sqlglot and a number, code, to the engines.)
            literal_tokens[start] = end
        else:
            spans.append((start, end))
    covered: list[tuple[int, int]] = []  # sqlglot's code tokens, merged, end exclusive
    for start, end in sorted(spans):
        if covered and start <= covered[-1][1]:
            covered[-1] = (covered[-1][0], max(end, covered[-1][1]))
        else:
            covered.append((start, end))
    if any(literal_tokens.get(start) != end for start, end in literals):
        return False
    index, count = 0, len(covered)
    for start, end in code:
        while index < count and covered[index][1] <= start:
            index += 1
        if index == count or covered[index][0] > start or covered[index][1] < end:
            return False
    return True


def _is_scalar_param(value: object) -> bool:
    return value is None or type(value) in (bool, int, float, str, bytes)


@final
class SqlGate:
    """Decides db payloads for one plugin's `table_prefix` in the host's dialect."""

    __slots__ = (
        "_cache",
        "_cache_size",
        "_dialect_obj",
        "_functions",
        "_max_length",
        "_user_types",
        "dialect",
        "table_prefix",
    )

    def __init__(
        self,
        table_prefix: str | None,
        *,
        dialect: Literal["sqlite", "postgres"] = "sqlite",
        cache_size: int = 1024,
        max_sql_length: int = DEFAULT_MAX_SQL_LENGTH,
    ) -> None:
        if dialect not in ("sqlite", "postgres"):
            raise ValueError("dialect is 'sqlite' or 'postgres'")
        if isinstance(max_sql_length, bool) or not isinstance(max_sql_length, int):
            raise TypeError("max_sql_length is an int")
        if max_sql_length <= 0:
            raise ValueError("max_sql_length must be positive")
        self._max_length = max_sql_length
        self.table_prefix: str | None = table_prefix or None
        self.dialect: str = dialect
        self._functions = _SQLITE_GATE_NAMES if dialect == "sqlite" else _POSTGRES_GATE_NAMES
        # SQLite reads any type name only for its affinity; PostgreSQL looks it up.
        self._user_types: frozenset[str] | Literal["any"] = (
            "any" if dialect == "sqlite" else _POSTGRES_USER_TYPES
        )
        self._dialect_obj = Dialect.get_or_raise(dialect)
        self._cache_size = max(0, cache_size)
        self._cache: OrderedDict[str, Allow | Deny] = OrderedDict()

    # -- runtime queries -------------------------------------------------------------------
    def check_query(self, sql: object, params: object = ()) -> Allow | Deny:
        if not isinstance(params, (list, tuple)) or not all(map(_is_scalar_param, params)):
            return _MALFORMED
        if not isinstance(sql, str) or not sql.strip():
            return _MALFORMED
        if len(sql) > self._max_length:
            return _NOT_PERMITTED  # before any parsing, and never cached
        if "\x00" in sql:
            # sqlglot reads NUL as an identifier character, C-string engines as the end of the
            # statement: a parser differential, so refuse (found by fuzzing).
            return _NOT_PERMITTED
        cache = self._cache
        hit = cache.get(sql)
        if hit is not None:
            cache.move_to_end(sql)
            return hit
        decision = self._decide_query(sql)
        if self._cache_size:
            cache[sql] = decision
            if len(cache) > self._cache_size:
                cache.popitem(last=False)
        return decision

    def _decide_query(self, sql: str) -> Allow | Deny:
        statement = self._single_statement(sql)
        if statement is None or not isinstance(statement, _ROOTS):
            return _NOT_PERMITTED
        walk = _Walk(
            self.table_prefix,
            self._functions,
            _QUERY_NODES,
            self._user_types,
            bounded_operands=self.dialect == "postgres",
        )
        try:
            walk.visit(statement, frozenset())
        except Exception:  # _Rejected, or anything unexpected: fail closed
            return _NOT_PERMITTED
        if walk.unscoped:
            return _OUT_OF_SCOPE
        return Allow(rule=self.table_prefix, target=sql)

    def _single_statement(self, sql: str) -> exp.Expr | None:
        with _QUIET.gating():
            return self._parse_one(sql)

    def _parse_one(self, sql: str) -> exp.Expr | None:
        try:
            tokens = self._dialect_obj.tokenize(sql)
            text = sql
            # The text test is a cheap filter (a C-level scan); the tokens decide.
            if self.dialect == "sqlite" and _MAYBE_SQLITE_SPELLING.search(sql):
                # Twice at most: a leading `REPLACE` hides the rest of the text in one token.
                for _ in range(2):
                    spelled = _sqlite_spellings(tokens, text)
                    if spelled is None:
                        break
                    text = spelled
                    tokens = self._dialect_obj.tokenize(text)
            # On the respelled text: a respelling only edits keywords and numbers, which
            # change nothing of what hides text from a parser.
            if not _lexically_agrees(text, tokens, self.dialect):
                return None
            if ";" in sql:
                last = len(tokens) - 1
                for i, token in enumerate(tokens):
                    # One trailing `;` at most; a `;` anywhere else means stacked statements.
                    if token.token_type is TokenType.SEMICOLON and i != last:
                        return None
            parsed = self._dialect_obj.parser(error_level=ErrorLevel.RAISE).parse(tokens, sql)
        except Exception:  # any parser failure is a refusal, never a crash
            return None
        # One statement, optionally followed by what a trailing `;` leaves behind: nothing,
        # or a bare `Semicolon` node carrying a trailing comment.
        if not parsed or parsed[0] is None or len(parsed) > 2:
            return None
        if len(parsed) == 2 and not (parsed[1] is None or type(parsed[1]) is exp.Semicolon):
            return None
        return parsed[0]

    # -- {"table": name} -------------------------------------------------------------------
    def check_table(self, name: object) -> Allow | Deny:
        if not isinstance(name, str) or not name:
            return _MALFORMED
        if not (name.isidentifier() and name.isascii()):
            return _OUT_OF_SCOPE
        if _is_system_name(name):
            return _NOT_PERMITTED
        prefix = self.table_prefix
        if not prefix or not name.lower().startswith(prefix):
            return _OUT_OF_SCOPE
        return Allow(rule=prefix, target=name)

    # -- migrations ------------------------------------------------------------------------
    def check_migration(self, sql: str) -> list[Allow | Deny]:
        with _QUIET.gating():
            return self._check_migration(sql)

    def _check_migration(self, sql: str) -> list[Allow | Deny]:
        if "\x00" in sql:
            # As in `check_query`: an identifier character to sqlglot, the end of the text to
            # C-string code (SQLite's statement splitter raised on it, past the gate).
            return [_NOT_PERMITTED]
        try:
            tokens = self._dialect_obj.tokenize(sql)
            if not _lexically_agrees(sql, tokens, self.dialect):
                return [_NOT_PERMITTED]
            parsed = self._dialect_obj.parser(error_level=ErrorLevel.RAISE).parse(tokens, sql)
        except Exception:  # any parser failure is a refusal, never a crash
            return [_NOT_PERMITTED]
        out: list[Allow | Deny] = []
        for statement in parsed:
            if statement is None:
                continue
            out.append(self._decide_migration_statement(statement))
        return out

    def _decide_migration_statement(self, statement: exp.Expr) -> Allow | Deny:
        if isinstance(statement, (exp.Create, exp.Drop)):
            kind = str(statement.args.get("kind") or "").upper()
            if kind not in _DDL_KINDS:
                return _NOT_PERMITTED
            target = statement.this
            if isinstance(target, exp.Schema):
                target = target.this
            if isinstance(target, exp.Index):
                walk_name = target.this
                if not isinstance(walk_name, exp.Identifier):
                    return _NOT_PERMITTED
                name = (
                    walk_name.this if walk_name.quoted else walk_name.this.translate(_ASCII_LOWER)
                )
                if not (self.table_prefix and name.startswith(self.table_prefix)):
                    return _OUT_OF_SCOPE
        elif isinstance(statement, exp.Alter):
            if str(statement.args.get("kind") or "").upper() != "TABLE":
                return _NOT_PERMITTED
        elif not isinstance(statement, _DML_ROOTS):
            return _NOT_PERMITTED
        walk = _Walk(
            self.table_prefix,
            self._functions,
            _DDL_NODES,
            self._user_types,
            bounded_operands=self.dialect == "postgres",
        )
        try:
            walk.visit(statement, frozenset())
        except Exception:  # _Rejected, or anything unexpected: fail closed
            return _NOT_PERMITTED
        if walk.unscoped:
            return _OUT_OF_SCOPE
        try:
            rendered = statement.sql(dialect=self.dialect)
        except Exception:  # RecursionError on a tree the walk could still descend: refuse
            return _NOT_PERMITTED
        return Allow(rule=self.table_prefix, target=rendered)

    def bounded_parameters(self, sql: str) -> frozenset[int]:
        """The `$n` parameters that a pattern or needle of `sql` is built from (postgres), to
        be bounded to `MAX_POSTGRES_PATTERN` by the adapter: `sql` is the text PostgreSQL
        parses (psycopg's rewrite). Empty for SQLite, or for text that does not parse."""
        if self.dialect != "postgres" or _MAYBE_PATTERN.search(sql) is None:
            return frozenset()
        statement = self._single_statement(sql)
        if statement is None:
            return frozenset()
        numbers: set[int] = set()
        for node in statement.find_all(*_POSTGRES_PATTERN_ARGS):
            operand = node.args.get(_POSTGRES_PATTERN_ARGS[type(node)])
            if not isinstance(operand, exp.Expr):
                continue
            for param in operand.find_all(exp.Parameter):
                number = param.this
                if isinstance(number, exp.Literal) and str(number.this).isdigit():
                    numbers.add(int(number.this))
        return frozenset(numbers)

    # -- explain ---------------------------------------------------------------------------
    def cte_names(self, sql: str) -> frozenset[str]:
        """Every CTE name `sql` defines, in any scope, ASCII-lower-cased as SQLite compares
        names (for the SQLite adapter's authorizer, which sees a CTE read under its name)."""
        statement = self._single_statement(sql)
        if statement is None:
            return frozenset()
        names: set[str] = set()
        for cte in statement.find_all(exp.CTE):
            alias = cte.args.get("alias")
            ident = alias.this if isinstance(alias, exp.TableAlias) else None
            if isinstance(ident, exp.Identifier) and isinstance(ident.this, str):
                names.add(ident.this.translate(_ASCII_LOWER))
        return frozenset(names)

    def query_shape(self, sql: str) -> tuple[bool, bool]:
        """(returns rows, may write) for `sql`, as parsed here: a SELECT or set operation
        returns rows, an INSERT/UPDATE/DELETE only with RETURNING; any INSERT/UPDATE/DELETE
        anywhere (a data-modifying CTE) may write. Unparsable text: (True, True)."""
        statement = self._single_statement(sql)
        if statement is None:
            return True, True
        writes = statement.find(*_DML_KINDS) is not None
        if isinstance(statement, tuple(_DML_KINDS)):
            return statement.args.get("returning") is not None, writes
        return True, writes

    def referenced_tables(self, sql: str) -> frozenset[str]:
        statement = self._single_statement(sql)
        if statement is None:
            return frozenset()
        walk = _Walk(self.table_prefix, self._functions, _DDL_NODES, self._user_types)
        with contextlib.suppress(Exception):
            walk.visit(statement, frozenset())
        return frozenset(walk.tables)
