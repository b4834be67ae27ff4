# mypy: ignore-errors
# ruff: noqa: UP031
# Technique: compile() through a container alias to build a code object.
def attack(secret_path, canary_path):
    fns = [compile]
    code = fns[0]("open(%r).read()" % secret_path, "<x>", "eval")
    return repr(code)
