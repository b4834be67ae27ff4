# mypy: ignore-errors
# Technique: match-statement class pattern with a dunder keyword attribute (`case
# object(__class__=c)`).
def attack(secret_path, canary_path):
    match ():
        case object(__class__=c):
            return repr(c.__subclasses__())
    return None
