# mypy: ignore-errors
# Technique: grow a list until memory runs out.
def attack(secret_path, canary_path):
    xs = []
    while True:
        xs.append("x" * 1_000_000)
