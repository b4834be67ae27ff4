# mypy: ignore-errors
# ruff: noqa: B009
# Technique: reach a function's code object (`f.__code__.replace`) to swap bytecode.
def attack(secret_path, canary_path):
    f = lambda: 0  # noqa: E731
    c = getattr(f, "__code__")
    return repr(c.replace(co_consts=(secret_path,)))
