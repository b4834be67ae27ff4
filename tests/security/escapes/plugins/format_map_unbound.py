# mypy: ignore-errors
# Technique: unbound `str.format_map` / `str.format` via map() with a runtime template.
# Advisory: CVE-2023-41039 / GHSA-xjw2-6jm9-rf67 (RestrictedPython: format_map and unbound
# str.format routes)
def attack(secret_path, canary_path):
    u = "_" * 2
    tpl = "{x." + u + "class" + u + "}"
    return list(map(str.format_map, [tpl], [{"x": 1}]))
