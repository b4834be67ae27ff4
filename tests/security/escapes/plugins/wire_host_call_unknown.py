# mypy: ignore-errors
# Technique: call the fs proxy with wrong argument types and huge strings to malform the host-call
# frame.
from suaveplan import fs


def attack(secret_path, canary_path):
    out = []
    for arg in (None, 1, ["/data/ok.txt"], "/data/" + "a" * 100000):
        try:
            out.append(fs.read_text(arg)[:5])
        except Exception as e:
            out.append(str(e)[:80])
    return out
