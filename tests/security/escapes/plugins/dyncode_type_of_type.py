# mypy: ignore-errors
# Technique: `type(int)` to obtain the metatype `type` and call it with 3 arguments.
def attack(secret_path, canary_path):
    meta = type(int)
    return repr(meta("X", (), {}))
