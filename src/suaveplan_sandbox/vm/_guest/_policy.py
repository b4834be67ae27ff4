"""Static AST policy: an allowlist of node types, dunder/frame attribute bans, import checks.

Direct `eval(...)`/`exec(...)`/`compile(...)` calls are rewritten to `__sp_direct_eval__()`,
which raises SAND_VM_EVAL_REJECTED at runtime (the plugin still loads). `.format` and
`.format_map` attribute loads are rewritten to a guarded helper.
"""

from __future__ import annotations

import ast
import unicodedata
from typing import Final

from suaveplan_sandbox.errors import SuaveplanError

ALLOWED_MODULES: Final = frozenset(
    {
        "json",
        "math",
        "cmath",
        "re",
        "datetime",
        "decimal",
        "fractions",
        "statistics",
        "random",
        "itertools",
        "functools",
        "collections",
        "dataclasses",
        "enum",
        "typing",
        "textwrap",
        "base64",
        "binascii",
        "hashlib",
        "hmac",
        "uuid",
        "csv",
        "io",
        "urllib.parse",
        "suaveplan",
    }
)
SUAVEPLAN_NAMES: Final = frozenset(
    {"fs", "fetch", "db", "secrets", "events", "log", "SuaveplanError"}
)
IO_NAMES: Final = frozenset({"StringIO", "BytesIO"})

FRAME_ATTRS: Final = frozenset(
    {
        "gi_frame",
        "gi_code",
        "gi_yieldfrom",
        "gi_running",
        "f_back",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_code",
        "f_trace",
        "f_lasti",
        "tb_frame",
        "tb_next",
        "tb_lasti",
        "cr_frame",
        "cr_code",
        "cr_await",
        "ag_frame",
        "ag_code",
        "ag_await",
        "func_globals",
        "func_code",
        "mro",
        "format_field",
        "get_field",
    }
)
EVAL_NAMES: Final = frozenset({"eval", "exec", "compile"})
DIRECT_EVAL: Final = "__sp_direct_eval__"
GUARD_FORMAT: Final = "__sp_format__"

_ALLOWED_NODES: Final[tuple[type[ast.AST], ...]] = (
    ast.Module,
    ast.Expr,
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.Return,
    ast.Pass,
    ast.Break,
    ast.Continue,
    ast.If,
    ast.For,
    ast.While,
    ast.With,
    ast.withitem,
    ast.Raise,
    ast.Try,
    ast.ExceptHandler,
    ast.Assert,
    ast.Delete,
    ast.Global,
    ast.Nonlocal,
    ast.FunctionDef,
    ast.ClassDef,
    ast.Lambda,
    ast.arguments,
    ast.arg,
    ast.keyword,
    ast.Import,
    ast.ImportFrom,
    ast.alias,
    ast.Name,
    ast.Load,
    ast.Store,
    ast.Del,
    ast.Attribute,
    ast.Subscript,
    ast.Slice,
    ast.Starred,
    ast.Constant,
    ast.List,
    ast.Tuple,
    ast.Set,
    ast.Dict,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
    ast.comprehension,
    ast.BoolOp,
    ast.BinOp,
    ast.UnaryOp,
    ast.Compare,
    ast.IfExp,
    ast.Call,
    ast.JoinedStr,
    ast.FormattedValue,
    ast.NamedExpr,
    ast.Yield,
    ast.YieldFrom,
    ast.And,
    ast.Or,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.MatMult,
    ast.Div,
    ast.Mod,
    ast.Pow,
    ast.LShift,
    ast.RShift,
    ast.BitOr,
    ast.BitXor,
    ast.BitAnd,
    ast.FloorDiv,
    ast.Invert,
    ast.Not,
    ast.UAdd,
    ast.USub,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.Is,
    ast.IsNot,
    ast.In,
    ast.NotIn,
    ast.Match,
    ast.match_case,
    ast.MatchValue,
    ast.MatchSingleton,
    ast.MatchSequence,
    ast.MatchMapping,
    ast.MatchClass,
    ast.MatchStar,
    ast.MatchAs,
    ast.MatchOr,
)


def norm(name: str) -> str:
    return unicodedata.normalize("NFKC", name)


def is_forbidden_attr(name: str) -> bool:
    n = norm(name)
    return n.startswith("__") or n in FRAME_ATTRS or n.startswith("co_")


def _err(code: str, msg: str, filename: str, node: ast.AST, **extra: str) -> SuaveplanError:
    details: dict[str, object] = {"file": filename, "line": getattr(node, "lineno", 0)}
    details.update(extra)
    return SuaveplanError(code, msg, details)  # type: ignore[arg-type]


class _Checker(ast.NodeTransformer):
    def __init__(self, filename: str, package_parts: int) -> None:
        self.filename = filename
        self.package_parts = package_parts
        self.imports: list[tuple[str, int, tuple[str, ...], ast.AST]] = []
        self.class_depth = 0

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if not isinstance(node, _ALLOWED_NODES):
            raise _err(
                "SAND_VM_SYNTAX_FORBIDDEN",
                f"syntax {type(node).__name__} is not allowed",
                self.filename,
                node,
            )
        return super().generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id.startswith("__") and node.id != "__name__":
            raise _err(
                "SAND_VM_ATTRIBUTE_FORBIDDEN", "dunder names are not allowed", self.filename, node
            )
        if node.id.startswith("__") and not isinstance(node.ctx, ast.Load):
            raise _err("SAND_VM_ATTRIBUTE_FORBIDDEN", "cannot bind __name__", self.filename, node)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if is_forbidden_attr(node.attr):
            raise _err(
                "SAND_VM_ATTRIBUTE_FORBIDDEN",
                "attribute access is not allowed",
                self.filename,
                node,
            )
        self.generic_visit(node)
        if node.attr in ("format", "format_map") and isinstance(node.ctx, ast.Load):
            call = ast.Call(
                func=ast.Name(id=GUARD_FORMAT, ctx=ast.Load()),
                args=[node.value, ast.Constant(node.attr)],
                keywords=[],
            )
            return ast.copy_location(call, node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in EVAL_NAMES:
            node.func = ast.copy_location(ast.Name(id=DIRECT_EVAL, ctx=ast.Load()), node.func)
        return node

    def _check_arg_names(self, args: ast.arguments) -> None:
        for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if a is not None and a.arg.startswith("__"):
                raise _err("SAND_VM_ATTRIBUTE_FORBIDDEN", "dunder parameter", self.filename, a)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        name = node.name
        if name.startswith("__") and not (
            self.class_depth and name.endswith("__") and len(name) > 4
        ):
            raise _err(
                "SAND_VM_ATTRIBUTE_FORBIDDEN",
                "dunder function names only in classes",
                self.filename,
                node,
            )
        self._check_arg_names(node.args)
        saved = self.class_depth
        self.class_depth = 0
        try:
            return self.generic_visit(node)
        finally:
            self.class_depth = saved

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        self._check_arg_names(node.args)
        return self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        if node.name.startswith("__"):
            raise _err("SAND_VM_ATTRIBUTE_FORBIDDEN", "dunder class name", self.filename, node)
        for kw in node.keywords:
            raise _err(
                "SAND_VM_SYNTAX_FORBIDDEN",
                f"class keyword {kw.arg}= is not allowed",
                self.filename,
                node,
            )
        self.class_depth += 1
        try:
            return self.generic_visit(node)
        finally:
            self.class_depth -= 1

    def _check_bound_name(self, name: str | None, node: ast.AST) -> None:
        # Binding forms whose target is a plain str, not a Name node: a dunder bound here
        # would shadow a guard hook (`__sp_format__`, `__sp_direct_eval__`) or rebind
        # `__name__`/`__builtins__` (RestrictedPython's CVE-2026-55830 was this kind of gap).
        if name is not None and norm(name).startswith("__"):
            raise _err(
                "SAND_VM_ATTRIBUTE_FORBIDDEN", "cannot bind a dunder name", self.filename, node
            )

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> ast.AST:
        self._check_bound_name(node.name, node)
        return self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> ast.AST:
        self._check_bound_name(node.name, node)
        return self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> ast.AST:
        self._check_bound_name(node.name, node)
        return self.generic_visit(node)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> ast.AST:
        self._check_bound_name(node.rest, node)
        return self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> ast.AST:
        for name in node.names:
            self._check_bound_name(name, node)
        return self.generic_visit(node)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> ast.AST:
        for name in node.names:
            self._check_bound_name(name, node)
        return self.generic_visit(node)

    def visit_MatchClass(self, node: ast.MatchClass) -> ast.AST:
        for attr in node.kwd_attrs:
            if is_forbidden_attr(attr):
                raise _err(
                    "SAND_VM_ATTRIBUTE_FORBIDDEN",
                    "match attribute not allowed",
                    self.filename,
                    node,
                )
        return self.generic_visit(node)

    def visit_alias(self, node: ast.alias) -> ast.AST:
        for n in (node.name, node.asname or ""):
            if n.startswith("_") or n == "*":
                raise _err(
                    "SAND_VM_ATTRIBUTE_FORBIDDEN", "private or star import", self.filename, node
                )
        return node

    def visit_Import(self, node: ast.Import) -> ast.AST:
        for a in node.names:
            self.visit_alias(a)
            self.imports.append((a.name, 0, (), node))
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        for a in node.names:
            if a.name == "*":
                raise _err("SAND_VM_SYNTAX_FORBIDDEN", "star import", self.filename, node)
            self.visit_alias(a)
        self.imports.append(
            (node.module or "", node.level, tuple(a.name for a in node.names), node)
        )
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, str) and "{" in node.value:
            check_format_string(node.value, self.filename, node)
        return node


def check_format_string(
    text: str, filename: str = "<runtime>", node: ast.AST | None = None
) -> None:
    """Reject str.format fields that reach dunder/private attributes or index chains."""
    import string

    try:
        parsed = list(string.Formatter().parse(text))
        fields = [f for _, f, _, _ in parsed if f]
        # str.format also resolves fields nested in a format spec (`{0:{1.attr}}`) and
        # hands their str() to the outer value's __format__: check those the same way.
        for _, _, spec, _ in parsed:
            if spec and "{" in spec:
                check_format_string(spec, filename, node)
    except ValueError:
        # str.format resolves the fields before the malformed tail, so at runtime a template
        # that does not parse must not pass unchecked; a constant may be a non-template.
        if node is None:
            raise
        return
    for field in fields:
        rest = field
        for sep in ".[":
            rest = rest.replace(sep, "\0")
        parts = rest.split("\0")[1:]
        if any(norm(p).lstrip().startswith("_") or is_forbidden_attr(p) for p in parts):
            if node is None:
                raise SuaveplanError(
                    "SAND_VM_ATTRIBUTE_FORBIDDEN", "format string names a private attribute"
                )
            raise _err(
                "SAND_VM_ATTRIBUTE_FORBIDDEN",
                "format string names a private attribute",
                filename,
                node,
            )


def check_module(
    source: str, filename: str
) -> tuple[ast.Module, list[tuple[str, int, tuple[str, ...], ast.AST]]]:
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise SuaveplanError(
            "SAND_VM_SYNTAX_FORBIDDEN",
            "plugin source does not parse",
            {"file": filename, "line": exc.lineno or 0},
        ) from exc
    checker = _Checker(filename, 0)
    new = checker.visit(tree)
    assert isinstance(new, ast.Module)
    ast.fix_missing_locations(new)
    return new, checker.imports
