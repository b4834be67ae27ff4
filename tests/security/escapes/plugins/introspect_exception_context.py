# mypy: ignore-errors
# Technique: walk `__context__`/`__cause__` of a caught host-raised error to reach host objects.
# Advisory: CVE-2023-32314 (vm2: a host object created unexpectedly inside error handling
# reached the guest)
def attack(secret_path, canary_path):
    try:
        eval("1")
    except Exception as e:
        return repr(e.__context__)
