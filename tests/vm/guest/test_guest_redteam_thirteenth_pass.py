"""Thirteenth red-team pass on the in-interpreter layer: the guards' own robustness against
hostile arguments (`str` subclasses as names, objects whose hooks lie or re-enter, trusted
callables that set attributes from names the plugin chose).

No real escape was found in this pass. Each probe below is pinned as contained:

* **`str` subclasses as names.** Every guard that takes a name reduces it to an exact `str`
  once (`norm()`, or `str.__str__`) and uses only that afterwards: the guarded `getattr`/
  `setattr`/`hasattr`, copy's state keys, `cached_property`'s `attrname`, the functional
  Enum API's names (an exact `str` is required there). A subclass whose `__str__`,
  `__eq__`, `__hash__`, `startswith` or `__getitem__` answers a harmless name while its
  data spells a private or dunder one is judged by its data.
* **Formatting templates of a `str` subclass** are parsed from the string's data, which
  the subclass cannot change, both bound (`s.format`) and unbound (`S.format(s)`), and
  through `collections.UserString`.
* **Trusted callables that set names the plugin chose.** `collections.namedtuple` (also
  with `rename=True`) requires exact `str` field names after its own checks, so a subclass
  overriding `isidentifier`/`startswith` cannot put text into the source it `eval`s;
  `typing.NamedTuple` goes through it; `dataclasses.replace` with a dunder keyword hands it
  to the class's own `__init__` (a TypeError); the functional Enum API refuses a dunder or
  a `str` subclass member name in a mapping.
* **Re-entrancy and exceptions.** A plugin `__getattr__` that raises the sandbox's own
  error inside `hasattr` only makes it answer False; a plugin hook that mutates its class
  between two lookups decides nothing the guard reads twice (the guards read each
  plugin-chosen value once).
"""

from __future__ import annotations

from pathlib import Path

from _redteam_support import create_plugin, outcome

FORBIDDEN = "SAND_VM_ATTRIBUTE_FORBIDDEN"
PLUGIN_ERROR = "SAND_VM_PLUGIN_ERROR"

PROBES = """
import collections
import dataclasses
import enum
import functools
import typing


def J(*parts):
    return "".join(parts)


class Liar(str):
    # Data spells one name; every overridable method answers another.
    def __str__(self):
        return "harmless"

    def __eq__(self, other):
        return other == "harmless"

    def __hash__(self):
        return hash("harmless")

    def startswith(self, prefix, *args):
        return False

    def isidentifier(self):
        return True

    def __getitem__(self, index):
        return "h"

    def replace(self, *args):
        return self

    def split(self, *args):
        return [self]


class Holder:
    harmless = 1


def getattr_foreign_private():
    return getattr(enum.Enum, Liar(J("_", "convert_")))


def getattr_dunder():
    return getattr(Holder(), Liar(J("_", "_class__")))


def hasattr_dunder():
    return hasattr(Holder(), Liar(J("_", "_dict__")))


def setattr_dunder():
    h = Holder()
    setattr(h, Liar(J("_", "_class__")), int)
    return repr(type(h))


def cached_property_dunder_name():
    class A:
        @functools.cached_property
        def p(self):
            return {"x": dataclasses.field()}

    A.p.attrname = Liar(J("_", "_dataclass_fields__"))
    return repr(A().p)


def format_bound():
    return Liar(J("{0._", "_class__}")).format(1)


def format_unbound():
    return Liar.format(Liar(J("{0._", "_class__}")), 1)


def format_user_string():
    return collections.UserString(Liar(J("{0._", "_class__}"))).format(1)


def enum_mapping_names():
    return repr(list(enum.Enum("E", {Liar(J("_", "_match_args__")): 1})))


def enum_mapping_dunder():
    return repr(list(enum.Enum("E", {J("_", "_match_args__"): ("x",)})))


def enum_string_names():
    return repr(list(enum.Enum("E", Liar(J("_", "_match_args__")))))


def namedtuple_fields():
    return repr(collections.namedtuple("N", [Liar("a) or (b")])._fields)


def namedtuple_rename():
    return repr(collections.namedtuple("N", [Liar("a) or (b")], rename=True)._fields)


def namedtuple_string():
    return repr(collections.namedtuple("N", Liar("a) or (b"))._fields)


def typing_namedtuple():
    return repr(typing.NamedTuple("N", [(Liar("a) or (b"), int)])._fields)


def replace_dunder():
    @dataclasses.dataclass
    class P:
        x: int

    return repr(dataclasses.replace(P(1), **{J("_", "_class__"): int}))


class Raiser:
    def __getattr__(self, name):
        raise getattr(enum.Enum, J("_", "convert_"))


def hasattr_reentrant():
    return hasattr(Raiser(), "anything")


class Flipper:
    def __eq__(self, other):
        Flipper.value = J("_", "convert_")
        return True

    def __hash__(self):
        return hash("name")


def getattr_reentrant_name():
    return getattr(enum.Enum, Flipper())
"""

# Probe -> its outcome, on every supported version.
# Probe -> its outcome, the same on every supported version. namedtuple takes the exact
# `str()` of each field name and checks that, so the `Liar`'s own answer is the field.
EXPECTED = {
    "getattr_foreign_private": FORBIDDEN,
    "getattr_dunder": FORBIDDEN,
    "hasattr_dunder": ("ok", False),
    "setattr_dunder": FORBIDDEN,
    "cached_property_dunder_name": FORBIDDEN,
    "format_bound": FORBIDDEN,
    "format_unbound": FORBIDDEN,
    "format_user_string": FORBIDDEN,
    "enum_mapping_names": FORBIDDEN,
    "enum_mapping_dunder": FORBIDDEN,
    "enum_string_names": FORBIDDEN,
    "namedtuple_fields": ("ok", "('harmless',)"),
    "namedtuple_rename": ("ok", "('harmless',)"),
    "namedtuple_string": ("ok", "('harmless',)"),
    "typing_namedtuple": ("ok", "('harmless',)"),
    "replace_dunder": PLUGIN_ERROR,
    "hasattr_reentrant": ("ok", False),
    "getattr_reentrant_name": PLUGIN_ERROR,
}


async def test_the_guards_judge_hostile_names_and_hooks_by_what_is_used(
    tmp_path: Path,
) -> None:
    sb = await create_plugin(tmp_path, PROBES, name="redteam13")
    async with sb:
        got = {name: await outcome(sb, name) for name in EXPECTED}
    assert got == EXPECTED


def test_the_dataclass_module_view_runs_no_hook_of_a_module_name() -> None:
    # `_plugin_module_visible` judges a class's `__module__` by lookups and writes
    # `sys.modules` under it: only an exact `str` is used, so a `str` subclass's hooks never
    # run there (no plugin route to such a `__module__` was found; this pins the rule).
    import sys

    from suaveplan_sandbox.vm._guest._runtime import _plugin_module_visible

    class Hooked(str):
        def __hash__(self) -> int:
            raise AssertionError("the name's __hash__ ran")

        def __eq__(self, other: object) -> bool:
            raise AssertionError("the name's __eq__ ran")

        def __str__(self) -> str:
            raise AssertionError("the name's __str__ ran")

    holder = type("Holder", (), {})
    holder.__module__ = Hooked("plugin_module")
    before = dict(sys.modules)
    with _plugin_module_visible(holder):
        assert sys.modules.keys() == before.keys()
