# mypy: ignore-errors
# Technique: `class M(typing.Type)` derives from the real `type` (typing.Type's
# `__mro_entries__`), so M is a metaclass the plugin writes: its `__instancecheck__` admits
# any subject, and `M(name, bases, namespace)` builds a class from any namespace, here with
# `__match_args__` naming `__globals__`. Found in the red-team pass of the in-interpreter
# layer; was a real in-interpreter escape before the fix.
import typing

from suaveplan import fs


class Meta(typing.Type):  # noqa: UP006 - the alias is the technique
    def __instancecheck__(cls, obj):
        return True


def attack(secret_path, canary_path):
    u = "_" * 2
    any_ = Meta("Any", (), {u + "match_args" + u: (u + "globals" + u,)})
    match fs.read_text:
        case any_(g):
            b = g["_b"]
            print("SANDBOX-" + "ESCAPED")
            out = [b.open(secret_path).read()]
            b.open(canary_path, "w").write("x")
            return out
    return "no match"
