# mypy: ignore-errors
# ruff: noqa: SIM115
# Technique: `open(path, 'w')` to create a file outside the allowlist.
def attack(secret_path, canary_path):
    open(canary_path, "w").write("x")
