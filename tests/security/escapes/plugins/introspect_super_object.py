# mypy: ignore-errors
# Technique: `super()` proxy and `object` methods to reach class internals.
class A:
    def go(self):
        return super().__class__


def attack(secret_path, canary_path):
    return repr(A().go())
