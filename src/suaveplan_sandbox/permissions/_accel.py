"""The optional C accelerator (`suaveplan_sandbox._speedups`): uncached fs and fetch checks,
the fs adapter's inline read (`fs_read_cached`) and the VM channel's polling wait
(`poll_recv`).

The pure-Python checks in `_fs_rules` and `_fetch_rules` are the reference; the C matchers
are drop-ins over the same tables, memo dicts and decision objects (see `_speedups.c` for
why they exist, and `tests/permissions/test_speedups.py` for the differential tests). A
missing accelerator changes speed, never a decision: it was not built (no C compiler when
the package was installed), it was switched off with `SUAVEPLAN_SANDBOX_NO_SPEEDUPS=1`, or
ada_url's shared object lacks the C API it calls (then only the fetch matcher is off).
`speedups_status()` says which.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Final, cast

if TYPE_CHECKING:
    from suaveplan_sandbox._speedups import FetchMatcher, FsMatcher

DISABLE_ENV: Final = "SUAVEPLAN_SANDBOX_NO_SPEEDUPS"


def _load() -> tuple[ModuleType | None, bool, str]:
    """(module, fetch usable, why not) for this process."""
    try:
        module = importlib.import_module("suaveplan_sandbox._speedups")
    except ImportError as exc:
        return None, False, f"not built ({exc})"
    try:
        wrapper = importlib.import_module("ada_url._ada_wrapper")
        module.bind_ada(wrapper.__file__)
    except (ImportError, AttributeError, TypeError, OSError) as exc:
        return module, False, f"fetch matcher off: {exc}"
    return module, True, ""


_module, _fetch_ok, _why = _load()
_ENV_OFF: Final = os.environ.get(DISABLE_ENV, "") not in ("", "0")
_enabled = not _ENV_OFF


def env_disabled() -> bool:
    """Whether `SUAVEPLAN_SANDBOX_NO_SPEEDUPS` switched the accelerator off in this process
    (the VM fork server is started with the same switch)."""
    return _ENV_OFF


def speedups_status() -> dict[str, object]:
    """Which C code this process uses: `{"fs": bool, "fetch": bool, "fs_read": bool,
    "poll": bool, "why": str}` (the fs and fetch matchers, the fs adapter's inline read,
    the VM channel's polling wait)."""
    fs = _module is not None and _enabled
    why = _why if _enabled else (f"disabled by {DISABLE_ENV}" if _ENV_OFF else "disabled")
    return {
        "fs": fs,
        "fetch": fs and _fetch_ok,
        "fs_read": fs_read_cached() is not None,
        "poll": poll_recv() is not None,
        "why": why if not (fs and _fetch_ok) else "",
    }


def fs_matcher() -> type[FsMatcher] | None:
    """The C fs matcher class, or None to use the Python reference."""
    if _module is None or not _enabled:
        return None
    return cast("type[FsMatcher]", _module.FsMatcher)


def fetch_matcher() -> type[FetchMatcher] | None:
    """The C fetch matcher class, or None to use the Python reference."""
    if _module is None or not _enabled or not _fetch_ok:
        return None
    return cast("type[FetchMatcher]", _module.FetchMatcher)


def fs_read_cached() -> Callable[[int, bytes, int, int, int, int, int], bytes | None] | None:
    """The C inline read `BeneathRootFs` uses, or None for its Python reference (not built,
    switched off, or a kernel header without openat2). Looked up when an adapter is made."""
    if _module is None or not _enabled:
        return None
    return getattr(_module, "read_cached", None)


def poll_recv() -> Callable[[int, bytearray, float], int] | None:
    """The C polling wait the VM channel uses (`_worker_loop.poll_receiver`), or None for
    its Python twin. Looked up when a channel is made."""
    if _module is None or not _enabled:
        return None
    return cast("Callable[[int, bytearray, float], int]", _module.poll_recv)


@contextlib.contextmanager
def _switched(on: bool) -> Iterator[None]:
    global _enabled  # noqa: PLW0603 - a process-wide test switch
    saved, _enabled = _enabled, on
    try:
        yield
    finally:
        _enabled = saved


def pure_python() -> contextlib.AbstractContextManager[None]:
    """Rule sets built inside this block use only the Python reference (for tests)."""
    return _switched(False)


def accelerated() -> contextlib.AbstractContextManager[None]:
    """Rule sets built inside this block use the C matchers, even under the environment
    switch (for the differential tests). Raises RuntimeError when they are not built."""
    if _module is None or not _fetch_ok:
        raise RuntimeError(f"the C accelerator is unavailable: {_why}")
    return _switched(True)
