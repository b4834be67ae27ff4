# mypy: ignore-errors
# Technique: an interval timer whose SIGALRM handler runs after the call returned, while the
# worker waits for the next frame, and writes the forbidden path from there.
import signal


def attack(secret_path, canary_path):
    def later(signum, frame):
        with open(canary_path, "w") as f:
            f.write("late")

    signal.signal(signal.SIGALRM, later)
    signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)
    return "armed"
