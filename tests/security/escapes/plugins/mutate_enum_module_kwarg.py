# mypy: ignore-errors
# Technique: enum functional API / namedtuple with `module=` naming a host module, hoping a
# later public helper writes members into sys.modules[module] (without global_enum).
import collections
import enum


def attack(secret_path, canary_path):
    x = enum.Enum("X", {"_check_name": 1, "fs": 2}, module="suaveplan_sandbox.vm._guest._runtime")
    n = collections.namedtuple("N", "a", module="builtins")
    u = "_" * 2
    cls = getattr((), u + "class" + u)
    return [repr(x), repr(n), repr(cls)]
