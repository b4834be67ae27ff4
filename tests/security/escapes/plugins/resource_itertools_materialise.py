# mypy: ignore-errors
# Technique: materialise an infinite iterator (list(itertools.count())) to exhaust memory.
import itertools


def attack(secret_path, canary_path):
    return len(list(itertools.count()))
