# mypy: ignore-errors
# Technique: call the `open` builtin directly to read the secret file.
def attack(secret_path, canary_path):
    with open(secret_path) as f:
        return f.read()
