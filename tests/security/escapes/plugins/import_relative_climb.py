# mypy: ignore-errors
# Technique: relative-import climbing (`from .. import x`) out of the plugin package.
def attack(secret_path, canary_path):
    from .. import os

    return os.environ["SUAVEPLAN_ESCAPE_CANARY"]
