# mypy: ignore-errors
# Technique: os.fork/os.system via the builtins module object.
import builtins


def attack(secret_path, canary_path):
    return builtins.open(secret_path).read()
