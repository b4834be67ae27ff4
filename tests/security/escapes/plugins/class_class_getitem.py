# mypy: ignore-errors
# Technique: `__class_getitem__` hook to capture the item and poke type internals.
class G:
    def __class_getitem__(cls, item):
        return cls.__mro__


def attack(secret_path, canary_path):
    return repr(G[int])
