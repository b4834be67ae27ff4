# mypy: ignore-errors
# Technique: copy/copyreg machinery (not allowlisted) to call an arbitrary reduce tuple.
import copy


def attack(secret_path, canary_path):
    return copy.deepcopy(1)
