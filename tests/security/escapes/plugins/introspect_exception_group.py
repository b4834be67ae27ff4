# mypy: ignore-errors
# Technique: ExceptionGroup split/derive and `except*` to obtain host-side exception objects.
# Advisory: CVE-2023-29199 (vm2: exception sanitisation bypassed through syntax the
# transformer did not handle, leaking unsanitised host exceptions)
def attack(secret_path, canary_path):
    eg = ExceptionGroup("g", [ValueError(1), KeyError(2)])
    match, rest = eg.split(ValueError)
    return [repr(match), repr(rest), repr(eg.derive([TypeError()]))]
