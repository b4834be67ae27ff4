# mypy: ignore-errors
# Technique: `weakref.finalize(..., atexit=True)` so that plugin code runs at interpreter exit,
# outside any call, and writes the forbidden path.
import weakref


class Holder:
    pass


KEEP = Holder()


def attack(secret_path, canary_path):
    weakref.finalize(KEEP, open, canary_path, "w")
    return "registered"
