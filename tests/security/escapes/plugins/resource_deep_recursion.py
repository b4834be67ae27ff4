# mypy: ignore-errors
# Technique: unbounded recursion to blow the C stack / recursion limit.
# Advisory: CVE-2019-10761 (vm2 < 3.6.11: a stack overflow raised where host code created
# the error handed the guest a host-realm exception)
def attack(secret_path, canary_path):
    def r(n):
        return r(n + 1) + 1

    return r(0)
