# mypy: ignore-errors
# Technique: fork from a second thread (hoping a per-thread filter or a lock state lets it
# through); the child would write the forbidden path.
import os
import threading


def attack(secret_path, canary_path):
    out = []

    def run():
        try:
            pid = os.fork()
        except OSError as e:
            out.append(f"refused:{e.errno}")
            return
        if pid == 0:
            with open(canary_path, "w") as f:
                f.write("child")
            os._exit(0)
        out.append("forked")

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out
