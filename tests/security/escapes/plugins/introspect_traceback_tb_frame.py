# mypy: ignore-errors
# Technique: exception `__traceback__.tb_frame.f_back` to reach the caller's frame (vm2
# CVE-2023-29017-style host frame via exception).
# Advisory: CVE-2023-29017 (vm2: host objects reached the guest through the stack-trace
# machinery of errors)
def attack(secret_path, canary_path):
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError as e:
        return repr(e.__traceback__.tb_frame.f_back.f_globals)
