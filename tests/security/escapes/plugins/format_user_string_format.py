# mypy: ignore-errors
# Technique: `collections.UserString(template).format(...)` is a plain Python method that
# calls the real `str.format` on its `data`: the guarded `.format` saw a UserString method,
# not `str.format`, and a template built at run time read `{0.__globals__}` of a runtime
# function. Found in the red-team pass of the in-interpreter layer; was a real
# in-interpreter escape (dunder values as text) before the fix.
# Advisory: CVE-2023-41039 / GHSA-xjw2-6jm9-rf67 (RestrictedPython: str.format reaches
# attributes the attribute guard refuses)
import collections

from suaveplan import fs


def attack(secret_path, canary_path):
    u = "_" * 2
    text = collections.UserString("{0." + u + "globals" + u + "}").format(fs.read_text)
    if "'_b'" in text:
        print("SANDBOX-" + "ESCAPED")
    return text[:200]
