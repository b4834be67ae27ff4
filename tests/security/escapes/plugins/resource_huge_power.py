# mypy: ignore-errors
# Technique: huge integer power (CPU and memory).
def attack(secret_path, canary_path):
    return 10**10**9
