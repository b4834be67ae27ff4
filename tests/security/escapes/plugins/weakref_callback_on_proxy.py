# mypy: ignore-errors
# Technique: a weakref callback on a host-side object (the fs proxy function), hoping the
# runtime drops it later and the callback runs in a trusted context with its referent.
import weakref

from suaveplan import fs


def attack(secret_path, canary_path):
    def cb(ref):
        with open(canary_path, "w") as f:
            f.write("cb")

    r = weakref.ref(fs.read_text, cb)
    return repr(r() is not None)
