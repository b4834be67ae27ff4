# mypy: ignore-errors
# Technique: match class pattern capturing `gi_frame` from a generator.
def attack(secret_path, canary_path):
    def gen():
        yield 1

    match gen():
        case object(gi_frame=fr):
            return repr(fr)
    return None
