# mypy: ignore-errors
# Technique: unwrap classmethod/staticmethod/property objects (`__func__`, fget) to reach function
# internals.
class A:
    @property
    def p(self):
        return 1


def attack(secret_path, canary_path):
    prop = A.p if False else vars(A)["p"]
    return repr(prop.fget.__globals__)
