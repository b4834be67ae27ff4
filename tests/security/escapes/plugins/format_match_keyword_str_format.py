# mypy: ignore-errors
# Technique: a match class pattern's keyword `format=` reads the real, unguarded `str.format`
# bound to a guest template, which then resolves dunder attribute chains (`{0.__class__}`)
# that the guarded `.format` refuses. Found in the red-team pass of the in-interpreter layer.
def attack(secret_path, canary_path):
    template = "{0." + "_" * 2 + "class" + "_" * 2 + "}"
    match template:
        case str(format=fmt):
            text = fmt(1)
            if "int" in text:
                print("SANDBOX-" + "ESCAPED")
            return text
    return "no match"
