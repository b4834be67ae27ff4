# mypy: ignore-errors
# Technique: build the format string at runtime so the static check cannot see it.
def attack(secret_path, canary_path):
    u = "_" * 2
    tpl = "{0." + u + "globals" + u + "}"
    return tpl.format(attack)
