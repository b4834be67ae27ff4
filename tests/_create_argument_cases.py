"""Bad arguments both create functions refuse with SAND_INVALID_ARGUMENT naming the argument:
the checks they share live in `suaveplan_sandbox._create_arguments`, so do their cases."""

from __future__ import annotations


class BytesPath:
    """An os.PathLike whose path is bytes."""

    def __fspath__(self) -> bytes:
        return b"/srv/plugin"


class NoMethods:
    """An object with none of the methods a metrics sink, clock or audit sink has."""


def bad_paths(argument: str, *, optional: bool) -> list[tuple[str, object]]:
    """Values a path argument refuses (None too unless it is `optional`)."""
    cases: list[tuple[str, object]] = [
        (argument, b"/srv/plugin"),
        (argument, 5),  # `os.stat(5)` or `open(5)` would take fd 5
        (argument, ""),  # would silently mean the current directory
        (argument, "plugin\x00.py"),
        (argument, BytesPath()),
    ]
    return cases if optional else [*cases, (argument, None)]


# The arguments `check_common_create_arguments` judges.
COMMON_BAD_ARGUMENTS: list[tuple[str, object]] = [
    ("policy", None),
    ("policy", {"name": "misuse"}),
    ("policy", "manifest.toml"),
    ("proxies", {"fs": None}),
    ("proxies", {"fetch": None}),
    ("proxies", "adapters"),
    ("plugin_name", 5),
    ("plugin_name", b"p"),
    ("plugin_name", ""),
    ("plugin_name", "../evil"),
    ("plugin_name", "p\nforged log line"),
    ("plugin_name", "p" * 100),
    ("metrics", "metrics"),
    ("metrics", NoMethods()),
    ("clock", 5),
    ("clock", NoMethods()),
    ("audit", 5),
    ("audit", "audit.jsonl"),
    ("audit", NoMethods()),
]
