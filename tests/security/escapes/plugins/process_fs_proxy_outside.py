# mypy: ignore-errors
# Technique: use the fs proxy with a path outside the allowlist (absolute and ../ traversal).
from suaveplan import fs


def attack(secret_path, canary_path):
    out = []
    for p in (secret_path, "/../outside/secret.txt", "/data/../../outside/secret.txt"):
        try:
            out.append(fs.read_text(p)[:80])
        except Exception as e:
            out.append(str(e)[:80])
    try:
        fs.write_text("/../outside/pwned", "x")
    except Exception as e:
        out.append(str(e)[:80])
    return out
