# mypy: ignore-errors
# Technique: `functools.update_wrapper` copies `__module__` from any object, so a plugin
# function's `__module__` became a `str` subclass of the plugin's; the worker compared it
# with its module table before the call, outside the error translation, and a
# `SuaveplanError` its `__eq__` raised went to the host with the plugin's code and message.
# Found in the second red-team pass of the in-interpreter layer; was a real in-interpreter
# escape (a sandbox-issued code forged from inside) before the fix.
import functools

from suaveplan import SuaveplanError


class Name(str):
    def __hash__(self):
        return hash("plugin")

    def __eq__(self, other):
        raise SuaveplanError("SAND_DB_ERROR", "SANDBOX-" + "ESCAPED", {"reason": "forged"})


class Source:
    @property
    def __module__(self):
        return Name("plugin")


def attack(secret_path, canary_path):
    return "never called"


functools.update_wrapper(attack, Source())
