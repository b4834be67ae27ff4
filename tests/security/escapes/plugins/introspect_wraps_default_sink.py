# mypy: ignore-errors
# Technique: functools.wraps with the default names but a non-function wrapper whose
# __setattr__ / __dict__ capture what update_wrapper copies (__dict__, __wrapped__, ...).
# Advisory: CVE-2023-37466 (vm2: a callback the host invoked (Promise handler) received
# unsanitised host values)
import functools

from suaveplan import fs

store = {}


class Sink:
    def __setattr__(self, name, value):
        store[name] = value


def attack(secret_path, canary_path):
    functools.wraps(fs.read_text)(Sink())
    return sorted(repr(v)[:40] for v in store.values())
