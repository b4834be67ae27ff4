# mypy: ignore-errors
# Technique: mutate an allowlisted module facade (`json.dumps = ...`) shared with host code.
import json


def attack(secret_path, canary_path):
    json.dumps = lambda *a, **k: "pwned"
    return json.dumps(1)
