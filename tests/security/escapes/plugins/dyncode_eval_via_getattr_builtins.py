# mypy: ignore-errors
# Technique: look eval up via a dict of builtins obtained from getattr/vars.
def attack(secret_path, canary_path):
    b = getattr(print, "__globals__", None)
    return repr(b)
