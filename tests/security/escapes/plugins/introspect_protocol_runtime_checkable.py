# mypy: ignore-errors
# Technique: a runtime_checkable Protocol declaring a dunder member makes isinstance() run
# getattr(host_obj, "__globals__") inside typing (an oracle on host attributes).
import typing

from suaveplan import fs


@typing.runtime_checkable
class HasGlobals(typing.Protocol):
    def __globals__(self): ...


def attack(secret_path, canary_path):
    return isinstance(fs.read_text, HasGlobals)
