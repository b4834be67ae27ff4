# mypy: ignore-errors
# Technique: control case for the update_wrapper guard: ordinary `@functools.wraps` on a plugin
# function still works and exposes nothing beyond the plugin's own function.
import functools


def deco(f):
    @functools.wraps(f)
    def inner(*a):
        return f(*a)

    return inner


@deco
def double(x):
    return 2 * x


def attack(secret_path, canary_path):
    return double(21)
