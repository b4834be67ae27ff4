# mypy: ignore-errors
# Technique: huge allocation to exhaust memory (vm2-style DoS).
def attack(secret_path, canary_path):
    return len(bytearray(8 * 1024**3))
