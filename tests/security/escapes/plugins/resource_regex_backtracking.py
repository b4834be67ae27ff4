# mypy: ignore-errors
# Technique: catastrophic regex backtracking (ReDoS) that spins inside C code holding the GIL.
import re


def attack(secret_path, canary_path):
    return bool(re.match(r"(a+)+$", "a" * 64 + "b"))
