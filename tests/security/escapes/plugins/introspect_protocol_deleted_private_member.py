# mypy: ignore-errors
# Technique: on 3.12+ a Protocol's `isinstance` checks the members typing listed when the
# class was made (`__protocol_attrs__`), while the runtime's guard listed the class's members
# when asked: a private member declared in the body and deleted afterwards passed the guard,
# and `isinstance` answered whether any object has that private attribute (here
# `ForwardRef._evaluate`), probed with `inspect.getattr_static`. Found in the tenth red-team
# pass of the in-interpreter layer; an attribute oracle (3.12-3.13), not an escape, before
# the fix (the guard checks the listed members too).
import typing


@typing.runtime_checkable
class Hashed(typing.Protocol):
    def __hash__(self):
        return 0


class Deleted(Hashed, typing.Protocol):
    _is_runtime_protocol = True

    def _evaluate(self):
        pass


del Deleted._evaluate


def attack(secret_path, canary_path):
    forward_ref = typing.get_args(typing.List["int"])[0]  # noqa: UP006 - makes the ForwardRef
    return {"has _evaluate": isinstance(forward_ref, Deleted), "int has": isinstance(1, Deleted)}
