# mypy: ignore-errors
# Technique: NFKC-equivalent attribute name passed to getattr at runtime (fullwidth underscore
# U+FF3F).
def attack(secret_path, canary_path):
    name = "\uff3f\uff3fclass\uff3f\uff3f"
    return repr(getattr((), name))
