# mypy: ignore-errors
# Technique: lazy `import os` inside the attacked function (deferred import).
def attack(secret_path, canary_path):
    import os

    return os.environ["SUAVEPLAN_ESCAPE_CANARY"]
