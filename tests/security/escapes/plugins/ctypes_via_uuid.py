# mypy: ignore-errors
# Technique: reach ctypes/subprocess through the allowlisted uuid module's internals.
import uuid


def attack(secret_path, canary_path):
    return [
        repr(getattr(uuid, "_uuid", None)),
        repr(getattr(uuid, "getnode", None)),
        repr(getattr(uuid, "os", None)),
    ]
