# mypy: ignore-errors
# Technique: patch a real class shared with the worker's own code through a module facade
# (dataclasses.Field.name, json.JSONEncoder.default, enum.Enum.value) to corrupt wire encoding.
import dataclasses
import enum
import json


def attack(secret_path, canary_path):
    out = []
    for cls, name in (
        (dataclasses.Field, "name"),
        (json.JSONEncoder, "default"),
        (enum.Enum, "value"),
    ):
        try:
            setattr(cls, name, property(lambda self: "forged"))
            out.append(name)
        except Exception as e:
            out.append(str(e)[:60])
    return out
