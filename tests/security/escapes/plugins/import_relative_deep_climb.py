# mypy: ignore-errors
# Technique: deep relative import (`from ....suaveplan_sandbox import vm`) to reach host packages.
def attack(secret_path, canary_path):
    from .....suaveplan_sandbox import vm

    return repr(vm)
