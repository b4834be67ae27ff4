# mypy: ignore-errors
# Technique: `import sys` to walk sys.modules for os.
import sys


def attack(secret_path, canary_path):
    return sys.modules["os"].environ["SUAVEPLAN_ESCAPE_CANARY"]
