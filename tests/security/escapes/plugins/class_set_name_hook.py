# mypy: ignore-errors
# Technique: `__set_name__` descriptor hook fired by class creation with the owner.
class D:
    def __set_name__(self, owner, name):
        self.owner_dict = owner.__dict__


class Owner:
    d = D()


def attack(secret_path, canary_path):
    return repr(vars(Owner)["d"].owner_dict)
