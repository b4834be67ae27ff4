# mypy: ignore-errors
# Technique: format-field index chain `{0[__builtins__]}` over a globals-like dict.
def attack(secret_path, canary_path):
    tpl = "{0" + "[_" + "_builtins_" + "_]}"
    return tpl.format({"__builtins__": 1})
