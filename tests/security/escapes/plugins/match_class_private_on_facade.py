# mypy: ignore-errors
# Technique: a match class pattern naming a single-underscore attribute (allowed by the AST
# policy) to pull a facade's hidden content mapping (`_sp_content`) out of the fs proxy.
from suaveplan import fs


def attack(secret_path, canary_path):
    match fs:
        case object(_sp_content=content):
            return repr(content)
    return "no match"
