# mypy: ignore-errors
# Technique: infinite loop to exhaust the wall clock.
def attack(secret_path, canary_path):
    while True:
        pass
