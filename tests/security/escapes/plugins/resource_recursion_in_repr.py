# mypy: ignore-errors
# Technique: recursion inside a host-invoked hook (`__repr__` of a returned-then-printed object).
class L:
    def __repr__(self):
        return repr(self)


def attack(secret_path, canary_path):
    print(L())
