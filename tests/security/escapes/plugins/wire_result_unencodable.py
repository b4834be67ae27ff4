# mypy: ignore-errors
# Technique: return a non-plain value (set/bytes-like/object) to confuse the result encoder.
def attack(secret_path, canary_path):
    return {1: {2, 3}, "f": attack}
