# mypy: ignore-errors
# ruff: noqa: RUF003
# Technique: NFKC-folded identifier in an import (`import ｏｓ`).
import ｏｓ


def attack(secret_path, canary_path):
    return ｏｓ.environ["SUAVEPLAN_ESCAPE_CANARY"]
