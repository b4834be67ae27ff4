# mypy: ignore-errors
# ruff: noqa: B009
# Technique: read a facade's private slot (`_sp_content`) and object.__getattribute__ bypass.
from suaveplan import fs


def attack(secret_path, canary_path):
    out = []
    try:
        out.append(repr(getattr(fs, "_sp_content")))
    except Exception as e:
        out.append(type(e).__name__)
    ga = getattr(object, "__getattribute__", None)
    out.append(repr(ga))
    return out
