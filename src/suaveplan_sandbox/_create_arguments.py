"""Argument checks both sandbox kinds' create functions share.

Each refuses, before anything is read, opened or compiled, an argument the create cannot use:
otherwise it surfaces later as an AttributeError or TypeError, or is used silently wrong (a
metrics sink without `inc` loses every count; a plugin label with a newline or a path in it
reaches metric labels and log lines; an int path is taken for a file descriptor, read and
closed with the file, another owner's descriptor such as the event loop's own).
"""

from __future__ import annotations

import os
import re

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.permissions._manifest import PLUGIN_NAME_PATTERN


def bad_argument(argument: str, message: str, value: object) -> SuaveplanError:
    """`SAND_INVALID_ARGUMENT` naming the argument and the type it was given."""
    return SuaveplanError(
        "SAND_INVALID_ARGUMENT", message, {"argument": argument, "type": type(value).__name__}
    )


def check_path_argument(argument: str, value: object, *, optional: bool = False) -> None:
    """A path argument is a non-empty `str` or `os.PathLike[str]` without NUL (None too when
    `optional`)."""
    if value is None and optional:
        return
    text = os.fspath(value) if isinstance(value, str | os.PathLike) else None
    if not isinstance(text, str) or not text or "\x00" in text:
        raise bad_argument(argument, f"{argument} is a non-empty str or os.PathLike path", value)


def check_common_create_arguments(
    *,
    policy: object,
    proxies: object,
    plugin_name: object,
    metrics: object,
    clock: object,
    audit: object,
) -> None:
    """The arguments `create_vm_sandbox` and `create_wasm_sandbox` have in common."""
    if not isinstance(policy, PermissionPolicy):
        raise bad_argument("policy", "policy must be a PermissionPolicy", policy)
    if proxies is not None and not isinstance(proxies, Adapters):
        raise bad_argument("proxies", "proxies must be an Adapters (or None)", proxies)
    if plugin_name is not None and not (
        isinstance(plugin_name, str) and re.fullmatch(PLUGIN_NAME_PATTERN, plugin_name)
    ):
        raise bad_argument(
            "plugin_name", "plugin_name must match the manifest's name pattern", plugin_name
        )
    for argument, value, method in (
        ("metrics", metrics, "inc"),
        ("clock", clock, "now"),
        ("audit", audit, "record"),
    ):
        if value is not None and not callable(getattr(value, method, None)):
            raise bad_argument(argument, f"{argument} must have a callable {method}()", value)


def check_unused_with_proxies(*, proxies: object, **only_without_proxies: object) -> None:
    """Refuse an argument that configures the adapter set a create opens itself when it is
    given no `proxies=`: with `proxies=` nothing would use it, and a host that passed both
    (`data_dir=` for its plugin's database) would be silently ignored."""
    if proxies is None:
        return
    for argument, value in only_without_proxies.items():
        if value is not None:
            raise SuaveplanError(
                "SAND_INVALID_ARGUMENT",
                f"{argument} configures the default adapters, which proxies= replaces: "
                f"pass it to open_standard_adapters instead",
                {
                    "argument": argument,
                    "type": type(value).__name__,
                    "reason": "ignored-with-proxies",
                },
            )
