# mypy: ignore-errors
# Technique: a raw `syscall(SYS_execve, "/bin/sh", ["sh", "-c", "cat secret > canary"])` via
# ctypes, bypassing glibc's wrappers (and any wrapper-level filter).
import ctypes


def attack(secret_path, canary_path):
    libc = ctypes.CDLL(None, use_errno=True)
    cmd = f"cat {secret_path} > {canary_path}".encode()
    argv = (ctypes.c_char_p * 4)(b"sh", b"-c", cmd, None)
    rc = libc.syscall(59, b"/bin/sh", argv, None)
    return f"execve:{rc}:{ctypes.get_errno()}"
