# mypy: ignore-errors
# Technique: import importlib and import_module('os') (importlib route).
import importlib


def attack(secret_path, canary_path):
    return importlib.import_module("os").environ["SUAVEPLAN_ESCAPE_CANARY"]
