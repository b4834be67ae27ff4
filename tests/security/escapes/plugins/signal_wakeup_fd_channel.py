# mypy: ignore-errors
# Technique: `signal.set_wakeup_fd` on the worker's channel socket so that every signal
# writes a byte into the wire, then raise signals to inject bytes between frames.
import os
import signal


def attack(secret_path, canary_path):
    for fd in range(3, 16):
        try:
            signal.set_wakeup_fd(fd)
            break
        except (OSError, ValueError):
            pass
    for _ in range(8):
        os.kill(os.getpid(), signal.SIGWINCH)
    return "injected"
