# mypy: ignore-errors
# ruff: noqa: B009
# Technique: user class overriding `__getattribute__` and `__getattr__` to intercept runtime
# lookups.
class Evil:
    def __getattr__(self, name):
        return name

    def __getattribute__(self, name):
        return object.__getattribute__(self, name)


def attack(secret_path, canary_path):
    e = Evil()
    return [e.anything, repr(getattr(e, "x"))]
