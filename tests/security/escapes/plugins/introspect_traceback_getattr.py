# mypy: ignore-errors
# ruff: noqa: B009, PLE0643
# Technique: traceback frame through getattr on the exception with runtime-built names.
def attack(secret_path, canary_path):
    try:
        [][1]
    except IndexError as e:
        tb = getattr(e, "_" + "_traceback_" + "_")
        return repr(getattr(tb, "tb_frame"))
