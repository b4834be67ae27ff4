# mypy: ignore-errors
# ruff: noqa: RUF003
# Technique: NFKC-folded reference to the `__import__` name (`＿＿import＿＿` is not a valid
# identifier, so use math-italic letters).
def attack(secret_path, canary_path):
    return __𝒾mport__("os").environ["SUAVEPLAN_ESCAPE_CANARY"]
