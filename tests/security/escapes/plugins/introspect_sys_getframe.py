# mypy: ignore-errors
# Technique: `sys._getframe(1).f_globals` to reach the runtime's frame.
import sys


def attack(secret_path, canary_path):
    return repr(sys._getframe(1).f_globals)
