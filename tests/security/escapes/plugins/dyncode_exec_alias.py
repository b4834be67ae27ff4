# mypy: ignore-errors
# Technique: indirect exec through an alias (vm2-style indirect eval, `e = exec; e(...)`).
def attack(secret_path, canary_path):
    run = exec
    ns = {}
    run("import os; r = os.environ['SUAVEPLAN_ESCAPE_CANARY']", ns)
    return ns.get("r")
