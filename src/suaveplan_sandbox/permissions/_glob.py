"""`*` globs matched without backtracking: fs rules and event topic rules share this.

`*` matches any run of characters (including `/` and `.`); nothing else is special.
"""

from __future__ import annotations

from collections.abc import Callable


def compile_glob(pattern: str) -> Callable[[str], object]:
    """A full-match test for a `*` glob: True, or None when `target` does not match.

    Not a regex: `.*` runs backtrack, so an fs rule such as `./*a*a*a*a*a*/x` (or ten stars in
    a row, which fuzzing found) took minutes against one long path, in the host's own loop;
    topic rules had the same flaw.
    Because `*` matches any run of characters, `/` included, a target matches exactly when it
    starts with the text before the first star, ends with the text after the last, and holds
    the texts between stars in order, without overlapping, in between. The leftmost place for
    each is always as good as any later one, so one `str.find` per text decides it: at most
    O(len(target) x stars), whatever the input.
    """
    parts = pattern.split("*")
    if len(parts) == 1:  # no star: the text itself
        return lambda target: True if target == pattern else None
    head, *middle, tail = parts
    middle = [text for text in middle if text]  # `**` is `*`
    least = len(head) + len(tail) + sum(len(text) for text in middle)

    def fullmatch(target: str) -> object:
        if len(target) < least or not target.startswith(head) or not target.endswith(tail):
            return None
        pos, end = len(head), len(target) - len(tail)
        for text in middle:
            found = target.find(text, pos, end)
            if found < 0:
                return None
            pos = found + len(text)
        return True

    return fullmatch
