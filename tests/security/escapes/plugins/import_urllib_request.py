# mypy: ignore-errors
# Technique: import a non-allowlisted submodule of an allowlisted package (urllib.request).
import urllib.request


def attack(secret_path, canary_path):
    return urllib.request.urlopen("file://" + secret_path).read()
