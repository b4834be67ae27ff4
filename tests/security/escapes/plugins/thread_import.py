# mypy: ignore-errors
# Technique: `import threading` to run code after the call returns.
import threading


def attack(secret_path, canary_path):
    threading.Thread(target=lambda: None).start()
