# mypy: ignore-errors
# Technique: reach `os` as an attribute of an allowed module (`random._os`, `json.decoder`)
# through the facade.
import json
import random


def attack(secret_path, canary_path):
    out = []
    for mod, name in ((random, "_os"), (json, "decoder"), (json, "scanner")):
        out.append(repr(getattr(mod, name, None)))
    return out
