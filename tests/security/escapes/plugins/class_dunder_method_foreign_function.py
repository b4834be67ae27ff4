# mypy: ignore-errors
# Technique: a decorated dunder method was checked only to stay a function (or a property,
# class or static method of one), so a decorator returning someone else's function put code
# the plugin did not write in a hook's place: trusted code calls `__eq__` with whatever it
# compares the object with, `__exit__` with the traceback of what failed in trusted code.
# Here `collections.UserList.append` as `__eq__` keeps each object the plugin's list is
# compared with. No escape was found through it (a plugin function is handed the same
# arguments); found in the eleventh red-team pass of the in-interpreter layer and closed as
# hardening (a dunder method is the plugin's own function, or typing's overload stub).
import collections

from suaveplan import fs


class Keep(collections.UserList):
    @(lambda method: collections.UserList.append)
    def __eq__(self, other):
        pass

    def __hash__(self):
        return 0


def attack(secret_path, canary_path):
    keep = Keep()
    found = keep in [fs.read_text, secret_path]
    return [found, len(keep)]
