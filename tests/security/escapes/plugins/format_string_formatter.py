# mypy: ignore-errors
# Technique: string.Formatter().get_field (not allowlisted: `import string`).
import string


def attack(secret_path, canary_path):
    return string.Formatter().get_field("0.__class__", [()], {})
