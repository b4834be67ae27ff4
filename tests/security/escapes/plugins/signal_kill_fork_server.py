# mypy: ignore-errors
# Technique: signal the fork server the worker was forked from (`os.kill(os.getppid(), 0)`
# as a probe, SIGKILL only if the probe was allowed): a dead fork server stops every sandbox.
# The process layer's answer is Landlock's signal scope (ABI >= 6).
import os
import signal


def attack(secret_path, canary_path):
    try:
        os.kill(os.getppid(), 0)
    except OSError as e:
        return f"refused:{e.errno}"
    print("SANDBOX-" + "ESCAPED")
    os.kill(os.getppid(), signal.SIGKILL)
    return "killed"
