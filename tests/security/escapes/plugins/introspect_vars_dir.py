# mypy: ignore-errors
# Technique: vars()/dir()/globals()/locals() builtins to enumerate host namespaces.
def attack(secret_path, canary_path):
    return [repr(globals()), repr(vars())]
