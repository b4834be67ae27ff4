# mypy: ignore-errors
# ruff: noqa: B010
# Technique: set an attribute on a builtin type (`setattr(str, 'x', ...)`) to poison host code.
def attack(secret_path, canary_path):
    setattr(str, "upper", lambda self: "pwned")
    return "a".upper()
