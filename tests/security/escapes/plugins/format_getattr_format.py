# mypy: ignore-errors
# ruff: noqa: B009
# Technique: getattr(template, 'format') to sidestep the rewritten attribute load.
def attack(secret_path, canary_path):
    u = "_" * 2
    tpl = "{0." + u + "init" + u + "." + u + "globals" + u + "}"
    return getattr(tpl, "format")(attack)
