# mypy: ignore-errors
# Technique: gi_frame through getattr with a runtime-concatenated name.
def attack(secret_path, canary_path):
    def gen():
        yield 1

    g = gen()
    fr = getattr(g, "gi_" + "frame")
    return repr(getattr(fr, "f_" + "back"))
