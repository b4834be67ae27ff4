# mypy: ignore-errors
# Technique: `from os import system` at module level.
from os import system


def attack(secret_path, canary_path):
    return system("touch " + canary_path)
