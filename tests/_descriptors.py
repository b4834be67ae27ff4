"""Counting a test's own open descriptors.

A leak check that counts every entry of /proc/self/fd also counts what other threads of the
test process open and close meanwhile (a compile child's socket, a finalizer of an earlier
test's objects), and fails at random; counting only the descriptors open on the test's own
tree sees the leak and nothing else."""

from __future__ import annotations

import os
from pathlib import Path


def descriptors_under(tree: Path) -> int:
    """Descriptors of this process open on `tree` itself or on anything beneath it."""
    top = str(tree)
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed since the listing
            continue
        if target == top or target.startswith(top + "/"):
            count += 1
    return count
