# mypy: ignore-errors
# Technique: `import ctypes` to call libc system().
import ctypes


def attack(secret_path, canary_path):
    return ctypes.CDLL(None).system(b"id")
