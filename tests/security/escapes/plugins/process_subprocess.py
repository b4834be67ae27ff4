# mypy: ignore-errors
# Technique: `import subprocess` to spawn a shell.
import subprocess


def attack(secret_path, canary_path):
    return subprocess.run(["touch", canary_path], check=False).returncode
