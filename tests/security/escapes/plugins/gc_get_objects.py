# mypy: ignore-errors
# Technique: `import gc` and gc.get_objects()/get_referrers() to find host objects.
import gc


def attack(secret_path, canary_path):
    return len(gc.get_objects())
