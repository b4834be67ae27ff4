"""Static AST policy: an allowlist of node types, dunder/frame attribute bans, import checks.

Direct `eval(...)`/`exec(...)`/`compile(...)` calls are rewritten to `__sp_direct_eval__()`,
which raises SAND_VM_EVAL_REJECTED at runtime (the plugin still loads). `.format` and
`.format_map` attribute loads are rewritten to a guarded helper. A `_private` attribute
(`obj._x`, read, written or deleted; likewise `x.obj`, see `OWNED_ONLY_ATTRS`) goes through
`__sp_private__(obj, "_x", store)` first, which lets it through only when the name
resolves to the plugin's own class, instance, function or module (a foreign
`ForwardRef._evaluate` or `Enum._convert_` would run `eval` or hand out a real module).
A decorated dunder method in a class body is checked to stay a method
(`__sp_dunder_def__`), so a decorator cannot turn `def __match_args__` into the tuple a
`match` class pattern reads attribute names from. A class body may not define the metaclass
hooks of `METACLASS_HOOKS` at all.
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
GUARD_PRIVATE: Final = "__sp_private__"
GUARD_DUNDER_DEF: Final = "__sp_dunder_def__"
GUARD_PURE: Final = "__sp_pure_self__"
GUARD_ATTR_HOOK: Final = "__sp_attr_hook__"
PURE_FLAG: Final = "__sp_self__"
GUARD_CLASS_STAMP: Final = "__sp_class_stamp__"
CLASS_STAMP: Final = "__sp_class__"
# Every name the rewrite inserts starts with this. A class body looks a name up in the
# class namespace before the builtins the guards live in, so a method named after a guard
# (`def __sp_private__(obj, name, store)`) would stand in for it in the rest of that body:
# no plugin definition may carry the prefix.
RESERVED_PREFIX: Final = "__sp_"
# Attribute names that hand out the unguarded `str.format` when read natively (by a match
# class pattern, a dataclass field of a `str` subclass, ...).
FORMAT_ATTRS: Final = frozenset({"format", "format_map"})
# Public names whose value on a foreign object can be an object the plugin never held:
# `AttributeError.obj` is whatever a failed lookup ran on, and typing's aliases run theirs
# on their origin (`typing.Type.nope` fails on the real `type`). Checked like `_private`
# names: readable only where they resolve to the plugin's own attribute.
OWNED_ONLY_ATTRS: Final = frozenset({"obj"})
# What standard-library code reads as `obj.__class__`/`obj.__dict__` it takes for the
# object's real class and instance dict (dataclasses' `__eq__` compares `__class__` and then
# reads each field, private ones too, from the other object). A plugin class's own
# definitions of these names, and its `__getattribute__`/`__getattr__`, are wrapped by
# `__sp_attr_hook__` (see `_guards.g_attr_hook`) so that neither can answer them.
SPOOFABLE_ATTRS: Final = frozenset({"__class__", "__dict__"})
ATTR_HOOKS: Final = frozenset({"__getattribute__", "__getattr__"})
# Hooks of a metaclass that CPython and the standard library also look up on a class (or
# on any object used as a class in isinstance/issubclass) with an ordinary attribute
# lookup, where a class's own definition shadows its metaclass's: `abc`'s C checks call
# `cls.__subclasscheck__(type(instance))` and `cls.__subclasses__()`, and
# `issubclass(C, obj)` calls `obj.__subclasscheck__(C)`. A plugin class defining one was
# handed the classes trusted code checked, e.g. the real `type` (`isinstance(int, P)`), whose
# three-argument call builds a class from any namespace. Plugins cannot write metaclasses,
# so these have no other use: a class body may not define them (nor, see
# `_guards.refuse_metaclass_hooks`, may a plugin class carry one another way).
METACLASS_HOOKS: Final = frozenset({"__subclasscheck__", "__instancecheck__", "__subclasses__"})

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
    """The exact `str` an attribute lookup of `name` uses, NFKC-normalised like identifiers.

    `str.__str__` first: a guest's `str` subclass could override `startswith`, `lstrip`,
    `__eq__`... (and `normalize` hands an already-normal subclass back unchanged), making
    `"__globals__"` look harmless to a check while getattr() still looks it up."""
    return unicodedata.normalize("NFKC", str.__str__(name))


def is_forbidden_attr(name: str) -> bool:
    n = norm(name)
    return n.startswith("__") or n in FRAME_ATTRS or n.startswith("co_")


def is_owned_only_attr(name: str) -> bool:
    """`_private` names and `OWNED_ONLY_ATTRS` (`name` already normalised): readable only
    where they resolve to the plugin's own attribute."""
    return name.startswith("_") or name in OWNED_ONLY_ATTRS


def is_guarded_attr(name: str) -> bool:
    """A name native code must not read for the guest unless ownership was checked: forbidden
    ones, `_private` ones, `OWNED_ONLY_ATTRS` and the two `str` formatting methods."""
    n = norm(name)
    return is_forbidden_attr(n) or is_owned_only_attr(n) or n in FORMAT_ATTRS


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
        if is_owned_only_attr(node.attr):
            # Checked at run time against the receiver: only the plugin's own objects.
            store = not isinstance(node.ctx, ast.Load)
            node.value = ast.copy_location(
                ast.Call(
                    func=ast.Name(id=GUARD_PRIVATE, ctx=ast.Load()),
                    args=[node.value, ast.Constant(node.attr), ast.Constant(store)],
                    keywords=[],
                ),
                node.value,
            )
            return node
        if node.attr in FORMAT_ATTRS and isinstance(node.ctx, ast.Load):
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

    def visit_comprehension(self, node: ast.comprehension) -> ast.AST:
        # `async for` in a comprehension is a flag on an allowed node, not a node, so the
        # allowlist alone never reviewed it (a generator expression may use it in a plain
        # function): refused like the rest of the async syntax.
        if node.is_async:
            raise _err(
                "SAND_VM_SYNTAX_FORBIDDEN",
                "asynchronous comprehensions are not allowed",
                self.filename,
                node.target,
            )
        return self.generic_visit(node)

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
        if norm(name).startswith(RESERVED_PREFIX):
            raise _err(
                "SAND_VM_ATTRIBUTE_FORBIDDEN",
                "a name of the sandbox runtime cannot be defined",
                self.filename,
                node,
            )
        if self.class_depth and name in METACLASS_HOOKS:
            raise _err(
                "SAND_VM_ATTRIBUTE_FORBIDDEN",
                f"a class may not define {name} (a metaclass hook)",
                self.filename,
                node,
            )
        self._check_arg_names(node.args)
        saved = self.class_depth
        self.class_depth = 0
        try:
            self.generic_visit(node)
        finally:
            self.class_depth = saved
        if name.startswith("__") and node.decorator_list:
            # Outermost, so it sees what the plugin's decorators made of the method.
            node.decorator_list.insert(
                0, ast.copy_location(ast.Name(id=GUARD_DUNDER_DEF, ctx=ast.Load()), node)
            )
        if saved and (name in SPOOFABLE_ATTRS or name in ATTR_HOOKS):
            # Outermost of all: what the class gets is the runtime's wrapper, from the
            # moment the class exists (a base's `__init_subclass__` already sees it).
            hook = ast.Call(
                func=ast.Name(id=GUARD_ATTR_HOOK, ctx=ast.Load()),
                args=[ast.Constant(name)],
                keywords=[],
            )
            node.decorator_list.insert(0, ast.copy_location(hook, node))
        _check_self_once(node)
        return node

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
            self.generic_visit(node)
        finally:
            self.class_depth -= 1
        # `__sp_class__ = __sp_class_stamp__()`: the namespace carries the token of the
        # `__build_class__` running it, so hooks that run while the class is being made
        # (an Enum member's `__init__`, `__init_subclass__`, `__set_name__`) already see it
        # as the plugin's. Removed from the class once it is built.
        token = ast.Assign(
            targets=[ast.Name(id=CLASS_STAMP, ctx=ast.Store())],
            value=ast.Call(
                func=ast.Name(id=GUARD_CLASS_STAMP, ctx=ast.Load()), args=[], keywords=[]
            ),
        )
        node.body.insert(1 if _has_docstring(node.body) else 0, ast.copy_location(token, node))
        return node

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

    def _check_pattern_name(self, expr: ast.expr, node: ast.AST) -> None:
        # A pattern's class or value is a dotted name the compiler requires as written: a
        # guarded attribute in it cannot be rewritten to its guard, so it is refused.
        while isinstance(expr, ast.Attribute):
            if is_guarded_attr(expr.attr):
                raise _err(
                    "SAND_VM_ATTRIBUTE_FORBIDDEN",
                    "a pattern may not name a private or formatting attribute",
                    self.filename,
                    node,
                )
            expr = expr.value

    def visit_MatchValue(self, node: ast.MatchValue) -> ast.AST:
        self._check_pattern_name(node.value, node)
        return self.generic_visit(node)

    def visit_MatchClass(self, node: ast.MatchClass) -> ast.AST:
        self._check_pattern_name(node.cls, node)
        # A keyword pattern is a native getattr on any subject the class admits (an ABC
        # admits whatever its `__subclasshook__` says): no private or formatting names.
        for attr in node.kwd_attrs:
            if is_guarded_attr(attr):
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


_SCOPES: Final = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _binds(node: ast.AST, me: str, first: ast.arg) -> bool:
    """Whether anything in `node` (nested scopes included) binds the name `me`."""
    for n in ast.walk(node):
        bound: list[str | None] = []
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            bound.append(n.id)
        elif isinstance(n, ast.arg) and n is not first:
            bound.append(n.arg)
        elif isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
            bound.append(n.name)
        elif isinstance(n, ast.MatchMapping):
            bound.append(n.rest)
        elif isinstance(n, ast.alias):
            bound += [n.asname, n.name.split(".")[0]]
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            bound += n.names
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n is not node:
            bound.append(n.name)
        if me in bound:
            return True
    return False


def _own_scope(nodes: list[ast.stmt]) -> list[ast.AST]:
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(nodes)
    while todo:
        n = todo.pop()
        out.append(n)
        if not isinstance(n, _SCOPES):
            todo.extend(ast.iter_child_nodes(n))
    return out


def _check_self_once(node: ast.FunctionDef) -> None:
    """`self._x` in a method: the receiver is checked once when the function starts.

    A pure plugin class (only plugin classes and `object` in its MRO) has nothing but
    plugin code and data behind any `_private` name, and neither an object's class nor a
    class's MRO can change (no dunder can be written). So when `self` (or `cls`) is never
    rebound, `__sp_self__ = __sp_pure_self__(self)` at entry lets each guarded access in
    the function's own scope skip the call: `(self if __sp_self__ else __sp_private__(...))`.
    """
    params = [*node.args.posonlyargs, *node.args.args]
    if not params or params[0].arg not in ("self", "cls"):
        return
    me, first = params[0].arg, params[0]
    sites = [
        n
        for n in _own_scope(node.body)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Call)
        and isinstance(n.value.func, ast.Name)
        and n.value.func.id == GUARD_PRIVATE
        and isinstance(n.value.args[0], ast.Name)
        and n.value.args[0].id == me
    ]
    if not sites or _binds(node, me, first):
        return
    for site in sites:
        call = site.value
        site.value = ast.copy_location(
            ast.IfExp(
                test=ast.Name(id=PURE_FLAG, ctx=ast.Load()),
                body=ast.Name(id=me, ctx=ast.Load()),
                orelse=call,
            ),
            call,
        )
    flag = ast.Assign(
        targets=[ast.Name(id=PURE_FLAG, ctx=ast.Store())],
        value=ast.Call(
            func=ast.Name(id=GUARD_PURE, ctx=ast.Load()),
            args=[ast.Name(id=me, ctx=ast.Load())],
            keywords=[],
        ),
    )
    node.body.insert(1 if _has_docstring(node.body) else 0, ast.copy_location(flag, node.body[0]))


def _has_docstring(body: list[ast.stmt]) -> bool:
    return bool(
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )


def check_format_string(
    text: str, filename: str = "<runtime>", node: ast.AST | None = None
) -> None:
    """Reject str.format fields that reach dunder, private or `obj` attributes."""
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
        # `obj` is private to the plugin's own objects (see OWNED_ONLY_ATTRS): a template
        # cannot tell whose object it formats, so it may not name `obj` at all.
        if any(
            norm(p).lstrip().startswith("_") or is_forbidden_attr(p) or norm(p) in OWNED_ONLY_ATTRS
            for p in parts
        ):
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
