# mypy: ignore-errors
# ruff: noqa: PLR1711
# Technique: mutate a shared builtin exception class (`ValueError.x = ...`) or SuaveplanError.
# Advisory: CVE-2022-36067 (vm2 'SandBreak': overriding the shared Error.prepareStackTrace
# hook, which host code then called with host objects)
from suaveplan import SuaveplanError


def attack(secret_path, canary_path):
    SuaveplanError.code = "OK"
    ValueError.args = property(lambda self: 1)
    return None
