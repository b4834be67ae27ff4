# mypy: ignore-errors
# Technique: the pidfd route around kill(2): `os.pidfd_open(getppid())` then
# `signal.pidfd_send_signal(fd, 0)`, and SIGKILL to the fork server if that was allowed.
import os
import signal


def attack(secret_path, canary_path):
    try:
        fd = os.pidfd_open(os.getppid())
    except OSError as e:
        return f"pidfd_open refused:{e.errno}"
    try:
        signal.pidfd_send_signal(fd, 0)
    except OSError as e:
        return f"pidfd_send_signal refused:{e.errno}"
    print("SANDBOX-" + "ESCAPED")
    signal.pidfd_send_signal(fd, signal.SIGKILL)
    return "killed"
