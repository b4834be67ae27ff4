# mypy: ignore-errors
# ruff: noqa: SIM115
# Technique: string annotations and defaults on a dataclass hoping dataclasses' generated
# source (exec) evaluates them.
import dataclasses


@dataclasses.dataclass
class D:
    a: "__import__('os').system('id')" = 1
    b: "open('/etc/passwd').read()" = dataclasses.field(default_factory=list)


def attack(secret_path, canary_path):
    return repr(D())
