"""Bad arguments both create functions refuse with SAND_INVALID_ARGUMENT naming the argument:
the checks they share live in `suaveplan_sandbox._create_arguments`, so do their cases."""

from __future__ import annotations

from pathlib import Path

from suaveplan_sandbox.adapters import Adapters


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


# Combinations a create refuses because it would silently ignore one of them; the first
# item is the argument the error names. `create_vm_sandbox` opens its default adapter set
# only without `proxies=`, so `data_dir=` (where that set keeps SQLite) would go unused.
# `create_wasm_sandbox` has no default set and nothing it takes depends on `proxies=`
# (its `cache_dir=` is a cache, used whenever a module is compiled), so it has none.
VM_IGNORED_COMBINATIONS: list[tuple[str, dict[str, object]]] = [
    ("data_dir", {"proxies": Adapters(), "data_dir": "/srv/plugin-data"}),
    ("data_dir", {"proxies": Adapters(), "data_dir": Path("relative/data")}),
]
