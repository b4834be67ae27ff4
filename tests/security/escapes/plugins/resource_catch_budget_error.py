# mypy: ignore-errors
# Technique: catch BaseException around an infinite loop to swallow the budget signal.
def attack(secret_path, canary_path):
    while True:
        try:
            while True:
                pass
        except BaseException:
            pass
