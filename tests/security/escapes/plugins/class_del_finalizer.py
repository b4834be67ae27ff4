# mypy: ignore-errors
# ruff: noqa: SIM115
# Technique: a `__del__` finalizer left behind to run inside the worker's host code after the
# call returns (outside the call's guard), trying to reach the OS from there.
keep = []


class Late:
    def __del__(self):
        open("/etc/passwd").read()


def attack(secret_path, canary_path):
    x = Late()
    x.cycle = x
    keep.append(Late())
    return "planted"
