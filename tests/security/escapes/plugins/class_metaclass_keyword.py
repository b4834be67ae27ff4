# mypy: ignore-errors
# Technique: `class X(metaclass=M)` to run a metaclass hook (class keyword).
class M(type):
    pass


class X(metaclass=M):
    pass


def attack(secret_path, canary_path):
    return repr(X)
