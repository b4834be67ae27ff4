# mypy: ignore-errors
# Technique: `dataclasses.dataclass` gives a class without a docstring a `__doc__` from
# `inspect.signature(cls)`, and inspect turns signature text into values with `eval` of
# each default's dotted name in `sys.modules` (the text comes from a `__signature__` that
# is a string or returns one on 3.12+, or from `__text_signature__` of anything that looks
# like a method descriptor, e.g. a plugin object `functools.wraps` put behind `__init__`).
# The plugin chose the names, dunders included: `sys.nope` looked `sys` up in the worker's
# `sys.modules`, and the `AttributeError` raised inside inspect reached the plugin carrying
# the `sys` module as `obj` (whose text a format field then read, see
# `format_attribute_error_obj_field`). Found in the sixth red-team pass of the
# in-interpreter layer; was a real in-interpreter escape (trusted `eval` of plugin text)
# before the fix.
import dataclasses
import functools

U = "_" * 2
TEXT = "(a=sys.nope)"


class Descriptor:
    def __get__(self, instance, owner=None):
        return self

    def __call__(self, *args):
        return None

    def __getattr__(self, name):
        if name == U + "text_signature" + U:
            return TEXT
        raise AttributeError(name)


def attack(secret_path, canary_path):
    out = []

    class ViaSignature:
        def __signature__():  # a string signature on 3.12+
            return TEXT

    class ViaTextSignature:
        @functools.wraps(Descriptor())
        def __init__(self):
            pass

    for cls in (ViaSignature, ViaTextSignature):
        try:
            dataclasses.dataclass(init=False)(cls)
            out.append("made")
        except Exception as exc:
            if "module 'sys' has no attribute 'nope'" in str(exc):
                print("SANDBOX-" + "ESCAPED")
            out.append(repr(exc)[:120])
    return out
