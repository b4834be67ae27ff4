# mypy: ignore-errors
# Technique: a `str` subclass as the attribute name of the guarded getattr(): its own
# `startswith` says "no dunder here" to the check, while the lookup uses the string's real
# contents (`__globals__` of a runtime function, reaching the real builtins). Found in the
# red-team pass of the in-interpreter layer; was a real in-interpreter escape before the fix.
from suaveplan import fs


class Name(str):
    def startswith(self, *args):
        return False

    def lstrip(self, *args):
        return "x"


def attack(secret_path, canary_path):
    g = getattr(fs.read_text, Name("_" + "_globals_" + "_"))
    b = g["_b"]
    print("SANDBOX-" + "ESCAPED")
    out = [b.open(secret_path).read()]
    b.open(canary_path, "w").write("x")
    return out
