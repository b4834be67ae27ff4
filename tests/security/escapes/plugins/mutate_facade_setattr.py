# mypy: ignore-errors
# Technique: overwrite a facade's function (`fs.read_text = ...`).
from suaveplan import fs


def attack(secret_path, canary_path):
    fs.read_text = lambda p: "pwned"
    return fs.read_text("/data/ok.txt")
