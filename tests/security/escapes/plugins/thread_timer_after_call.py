# mypy: ignore-errors
# Technique: `threading.Timer` that outlives the call and writes the forbidden path and
# reads the secret once the host thinks the plugin is idle.
import threading


def attack(secret_path, canary_path):
    def later():
        with open(secret_path) as f:
            data = f.read()
        with open(canary_path, "w") as f:
            f.write(data)

    threading.Timer(0.01, later).start()
    return "scheduled"
