# mypy: ignore-errors
# Technique: private-name import alias (`from json import _default_decoder`) to reach module
# internals.
from json import _default_decoder


def attack(secret_path, canary_path):
    return repr(_default_decoder)
