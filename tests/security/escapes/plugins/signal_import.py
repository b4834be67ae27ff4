# mypy: ignore-errors
# ruff: noqa: PLR1711
# Technique: `import signal` to install a handler or alarm that outlives the call.
import signal


def attack(secret_path, canary_path):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    return None
