# mypy: ignore-errors
# Technique: inject code through collections.namedtuple field names / defaults (namedtuple
# builds its __new__ with eval of generated source).
import collections


def attack(secret_path, canary_path):
    out = []
    for names in ("a, b=__import__('os')", "a) or open('/etc/passwd') or (b", ["x", "_y"]):
        try:
            out.append(repr(collections.namedtuple("N", names)))
        except Exception as e:
            out.append(str(e)[:80])
    return out
