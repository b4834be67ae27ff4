# mypy: ignore-errors
# Technique: functools.lru_cache internals / cache_info to reach host references.
import functools


@functools.lru_cache
def f(x):
    return x


def attack(secret_path, canary_path):
    f(1)
    return [repr(f.cache_info()), repr(getattr(f, "__wrapped__", None))]
