# mypy: ignore-errors
# Technique: 3-argument type() to create a class dynamically with a crafted namespace.
def attack(secret_path, canary_path):
    cls = type("X", (object,), {"go": lambda self: 1})
    return repr(cls)
