# mypy: ignore-errors
# Technique: __subclasses__ walk through builtin getattr with runtime-built names.
def attack(secret_path, canary_path):
    u = "_" * 2
    base = getattr(getattr((), u + "class" + u), u + "base" + u)
    return [c for c in getattr(base, u + "subclasses" + u)()][:3]
