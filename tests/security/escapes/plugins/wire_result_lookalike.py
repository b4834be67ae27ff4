# mypy: ignore-errors
# Technique: return a value that imitates a wire frame / error envelope (dict with type/code
# keys).
def attack(secret_path, canary_path):
    return {"type": "result", "id": 0, "ok": True, "code": "OK", "__sp__": 1, "value": "x" * 100}
