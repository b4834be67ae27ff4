# mypy: ignore-errors
# Technique: unbounded recursion to blow the C stack / recursion limit.
def attack(secret_path, canary_path):
    def r(n):
        return r(n + 1) + 1

    return r(0)
