# mypy: ignore-errors
# Technique: `type(len)` (BuiltinFunctionType) and `type(iter([]))` family to reach dangerous
# types.
def attack(secret_path, canary_path):
    return repr(type(len))
