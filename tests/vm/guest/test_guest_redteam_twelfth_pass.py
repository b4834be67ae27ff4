"""Twelfth red-team pass on the in-interpreter layer: what the static AST policy sees versus
what the compiler and the interpreter do (identifier normalisation, private name mangling,
syntax by version, the compiler's implicit names, and the names the policy's own rewrite
inserts).

One real escape:

1. **A class body shadowed the guard hooks the rewrite inserts.** The rewrite turns
   `obj._x` into `__sp_private__(obj, "_x", False)._x` (likewise `__sp_format__`,
   `__sp_dunder_def__`, `__sp_attr_hook__`, ...), and the hooks live in the plugin's
   builtins. A class body looks a name up in the class namespace first, and a class could
   define any dunder method, so `def __sp_private__(obj, name, store): return obj` stood in
   for the guard in the rest of that body: `enum.Enum._convert_` read natively built an
   enum of the real `os` module's functions (`getcwd`, `open`, `read`). 3.11-3.13. No plugin
   definition may now carry the runtime's `__sp_` prefix (every other binding form already
   refused dunder names), and a test pins that every name the rewrite inserts carries it.

A leftover closed as hardening (no escape found through it): an asynchronous comprehension
(`(x async for x in it)`, legal in a plain function) is no longer accepted. `is_async` is a
flag of an allowed node, not a node, so the node allowlist never reviewed it; the worker
runs no event loop and sets no async-generator hooks, so the async generator it made reached
nothing, but unreviewed syntax is refused.

Pinned probes that were already contained: identifiers spelt with fullwidth or
mathematical letters (the parser normalises them before the check sees them, in names,
attributes, keyword and match-keyword names, import names and definitions); private name
mangling (every `__x` is refused before mangling could rename it); PEP 695 type aliases and
type parameters, PEP 696 defaults, `except*` and `await` (not in the allowlist); PEP 701
f-string forms (nested quotes, comments, `=`, nested format specs: the policy walks every
expression inside); `from __future__ import annotations` (an import like any other,
refused); `__debug__`, `global`/`del`/walrus/`for`/`with`/`except`/match bindings of guard
names; a dunder keyword argument name (a plain dict key, as with `**{...}`); and augmented,
annotated and starred assignment to a foreign private attribute (each goes through the
guard with `store`).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from _redteam_support import create_plugin, outcome

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm import VmSandbox
from suaveplan_sandbox.vm._guest import _policy
from suaveplan_sandbox.vm._guest._policy import RESERVED_PREFIX, check_module

FORBIDDEN = "SAND_VM_ATTRIBUTE_FORBIDDEN"
SYNTAX = "SAND_VM_SYNTAX_FORBIDDEN"
IMPORT = "SAND_VM_MODULE_IMPORT_FORBIDDEN"

ESCAPE = """
import enum


class Shadow:
    def __sp_private__(obj, name, store):
        return obj

    members = enum.Enum._convert_("Probe", "os", lambda n: n == "getcwd")


def attack():
    return [m.value() for m in Shadow.members]
"""

# Every name the rewrite inserts (the guard hooks, the class stamp, the method flag) and
# the runtime's own builtin, each defined as a method in a class body.
RUNTIME_NAMES = sorted(
    {
        value
        for key, value in vars(_policy).items()
        if key.isupper()
        and isinstance(value, str)
        and value.startswith(RESERVED_PREFIX)
        and value != RESERVED_PREFIX
    }
    | {"__sp_suaveplan__"}
)


async def _load_error(tmp_path: Path, source: str) -> str | None:
    """The code `source` is refused with when the sandbox is created, or None if it loads."""
    try:
        sb = await create_plugin(tmp_path, source, name="redteam12")
    except SuaveplanError as err:
        return err.code
    async with sb:
        return None


async def test_a_class_body_cannot_shadow_the_private_guard(tmp_path: Path) -> None:
    # Before the fix the plugin loaded and `attack` returned the worker's real cwd.
    assert await _load_error(tmp_path, ESCAPE) == FORBIDDEN


def test_the_runtime_names_cover_every_guard_hook() -> None:
    assert {
        "__sp_private__",
        "__sp_format__",
        "__sp_direct_eval__",
        "__sp_dunder_def__",
        "__sp_attr_hook__",
        "__sp_class_stamp__",
        "__sp_pure_self__",
    } <= set(RUNTIME_NAMES)


@pytest.mark.parametrize("name", RUNTIME_NAMES)
@pytest.mark.parametrize("nesting", ["class", "nested class", "method of a nested function"])
async def test_no_definition_may_carry_a_runtime_name(
    tmp_path: Path, name: str, nesting: str
) -> None:
    body = f"def {name}(*args):\n    return args[0]\n"
    if nesting == "class":
        source = "class A:\n" + _indent(body)
    elif nesting == "nested class":
        source = "class A:\n    class B:\n" + _indent(_indent(body))
    else:
        source = "def outer():\n    class A:\n" + _indent(_indent(body)) + "    return A\n"
    assert await _load_error(tmp_path, source) == FORBIDDEN


@pytest.mark.parametrize(
    "spelling",
    [
        "__\U0001d42cp_private__",  # MATHEMATICAL BOLD SMALL S
        "__s\u1d56_private__",  # MODIFIER LETTER SMALL P
    ],
)
async def test_a_runtime_name_spelt_with_compatibility_letters_is_refused(
    tmp_path: Path, spelling: str
) -> None:
    source = f"class A:\n    def {spelling}(obj, name, store):\n        return obj\n"
    assert await _load_error(tmp_path, source) == FORBIDDEN


def test_every_name_the_rewrite_inserts_carries_the_reserved_prefix() -> None:
    # A source that makes the rewrite insert each of its hooks.
    source = """
import functools


class A:
    "doc"

    def __getattribute__(self, name):
        return name

    @functools.cache
    def __repr__(self):
        return "A"

    def m(self):
        return self._x

    y = "{}".format
    z = eval("1")
"""
    tree, _ = check_module(source, "plugin.py")
    inserted = {
        n.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and n.id.startswith("__") and n.id != "__name__"
    }
    assert inserted == {
        "__sp_attr_hook__",
        "__sp_class__",
        "__sp_class_stamp__",
        "__sp_direct_eval__",
        "__sp_dunder_def__",
        "__sp_format__",
        "__sp_private__",
        "__sp_pure_self__",
        "__sp_self__",
    }
    assert all(name.startswith(RESERVED_PREFIX) for name in inserted)


OWN_DUNDERS = """
class Point:
    def __init__(self, x):
        self._x = x

    def __eq__(self, other):
        return isinstance(other, Point) and other._x == self._x

    def __hash__(self):
        return hash(self._x)

    def __repr__(self):
        return f"Point({self._x})"

    def sp_helper(self):
        return self._x


def attack():
    return [repr(Point(1)), Point(2) == Point(2), Point(3).sp_helper()]
"""


async def test_the_plugins_own_dunder_methods_keep_working(tmp_path: Path) -> None:
    async with await create_plugin(tmp_path, OWN_DUNDERS, name="redteam12") as sb:
        assert await outcome(sb, "attack") == ("ok", ["Point(1)", True, 3])


ASYNC_COMPREHENSIONS = [
    "def f(it):\n    return (x async for x in it)\n",
    "def f(it):\n    return ([x async for x in y] for y in it)\n",
    "def f(it):\n    return ({x: x async for x in y} for y in it)\n",
]


@pytest.mark.parametrize("source", ASYNC_COMPREHENSIONS)
async def test_an_asynchronous_comprehension_is_refused(tmp_path: Path, source: str) -> None:
    # Before the fix the first one loaded and made a driveable async generator.
    assert await _load_error(tmp_path, source) == SYNTAX


# Refused at load on every supported version (some are not even syntax on older ones).
REFUSED_AT_LOAD = {
    # identifiers the parser NFKC-normalises before the policy sees them
    "mathematical letters in an attribute": ("x = (1).__\U0001d41c\U0001d425ass__\n", FORBIDDEN),
    "mathematical letters in a name": ("x = __\U0001d41builtins__\n", FORBIDDEN),
    "mathematical letters in a match keyword": (
        "match 1:\n    case int(__\U0001d41c\U0001d425ass__=c):\n        pass\n",
        FORBIDDEN,
    ),
    "mathematical letters in an import alias": ("import json as _\U0001d423\n", FORBIDDEN),
    "mathematical letters in a from-import": (
        "from json import _\U0001d41default_encoder\n",
        FORBIDDEN,
    ),
    "mathematical letters in a method name": (
        "class A:\n    def __\U0001d42cubclasscheck__(c):\n        pass\n",
        FORBIDDEN,
    ),
    # private name mangling: every `__x` is refused before it could be renamed
    "mangled attribute": ("class A:\n    def f(self):\n        return self.__x\n", FORBIDDEN),
    "mangled name": ("class A:\n    def f(self):\n        return __x\n", FORBIDDEN),
    "mangled parameter": ("class A:\n    def f(self, __x):\n        pass\n", FORBIDDEN),
    "mangled class-body binding": ("class _A:\n    __x = 1\n", FORBIDDEN),
    # syntax by version
    "type alias (3.12)": ("type X = int\n", SYNTAX),
    "generic function (3.12)": ("def f[T](x):\n    return x\n", SYNTAX),
    "generic class (3.12)": ("class C[T]:\n    pass\n", SYNTAX),
    "type parameter default (3.13)": ("def f[T = int]():\n    pass\n", SYNTAX),
    "type parameter named like a guard": ("def f[__sp_private__]():\n    pass\n", SYNTAX),
    "except star": ("try:\n    pass\nexcept* ValueError:\n    pass\n", SYNTAX),
    "await": ("async def f(x):\n    await x\n", SYNTAX),
    "future annotations": ("from __future__ import annotations\n", IMPORT),
    "__debug__": ("x = __debug__\n", FORBIDDEN),
    # f-strings: every expression inside is walked (3.12 allows nesting, comments, `=`)
    "nested f-string": ("x = f\"{f'{len.__self__}'}\"\n", FORBIDDEN),
    "f-string format spec": ("x = f'{1:{len.__self__}}'\n", FORBIDDEN),
    "f-string debug form": ("x = f'{len.__self__=}'\n", FORBIDDEN),
    # Not syntax before 3.12; from 3.12 the expression is walked like any other.
    "f-string comment (3.12)": (
        "x = f'''{len  # c\n .__self__}'''\n",
        FORBIDDEN if sys.version_info >= (3, 12) else SYNTAX,
    ),
    "doubled braces naming a dunder": ("x = f'{{0.__class__}}'.format(1)\n", FORBIDDEN),
    # other binding forms of a guard name
    "walrus in a comprehension": ("def f():\n    [(__sp_private__ := 1) for i in ()]\n", FORBIDDEN),
    "global": ("def f():\n    global __sp_format__\n", FORBIDDEN),
    "nonlocal": (
        "def f():\n    x = 1\n\n    def g():\n        nonlocal __sp_format__\n",
        FORBIDDEN,
    ),
    "del": ("del __sp_private__\n", FORBIDDEN),
    "for target": ("for __sp_private__ in ():\n    pass\n", FORBIDDEN),
    "with target": ("with x as __sp_private__:\n    pass\n", FORBIDDEN),
    "except target": ("try:\n    pass\nexcept E as __sp_private__:\n    pass\n", FORBIDDEN),
    "match capture": ("match 1:\n    case __sp_private__:\n        pass\n", FORBIDDEN),
    "match mapping rest": ("match 1:\n    case {**__sp_private__}:\n        pass\n", FORBIDDEN),
    "import alias": ("import json as __sp_private__\n", FORBIDDEN),
    "class name": ("class __sp_private__:\n    pass\n", FORBIDDEN),
    "module-level function": ("def __sp_private__(a, b, c):\n    return a\n", FORBIDDEN),
    "lambda parameter": ("f = lambda __sp_private__: 1\n", FORBIDDEN),
}


@pytest.mark.parametrize("case", sorted(REFUSED_AT_LOAD))
async def test_probe_is_refused_at_load(tmp_path: Path, case: str) -> None:
    source, code = REFUSED_AT_LOAD[case]
    assert await _load_error(tmp_path, source) == code


RUNTIME_PROBES = """
import enum


class E(enum.Enum):
    A = 1


def augmented_private_of_a_foreign_class():
    E._missing_ += 1


def starred_into_a_foreign_private():
    a, *E._missing_ = 1, 2


def annotated_into_a_foreign_private():
    E._missing_: int = 1


def a_dunder_keyword_name_is_a_plain_key():
    return sorted(dict(__class__=1, __globals__=2))
"""


@pytest.fixture
async def probes(tmp_path: Path) -> VmSandbox:
    return await create_plugin(tmp_path, RUNTIME_PROBES, name="redteam12")


@pytest.mark.parametrize(
    "name",
    [
        "augmented_private_of_a_foreign_class",
        "starred_into_a_foreign_private",
        "annotated_into_a_foreign_private",
    ],
)
async def test_assignment_forms_to_a_foreign_private_go_through_the_guard(
    probes: VmSandbox, name: str
) -> None:
    async with probes as sb:
        assert await outcome(sb, name) == FORBIDDEN


async def test_a_dunder_keyword_name_is_only_a_dict_key(probes: VmSandbox) -> None:
    async with probes as sb:
        assert await outcome(sb, "a_dunder_keyword_name_is_a_plain_key") == (
            "ok",
            ["__class__", "__globals__"],
        )


def _indent(text: str) -> str:
    return "".join("    " + line + "\n" if line else "\n" for line in text.splitlines())
