"""The plugin `make run` posts to the ASGI host example (runs inside the VM sandbox)."""

from suaveplan import fs


def word_count(path):
    """Count the words in one uploaded file."""
    return len(fs.read_text(path).split())


def spin():
    """Never returns: the host's wall-clock budget ends it."""
    n = 0
    while True:
        n += 1
