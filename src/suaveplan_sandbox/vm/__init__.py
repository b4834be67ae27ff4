"""Python plugins in hardened worker processes forked from a clean fork server.

The names below are loaded on first use, not when the package is imported: the fork server
imports its own modules from this package (`_zygote_main`, `_guest`, `_hardening`,
`_worker_loop`), and an eager import of the host side here would load the whole host stack
(pydantic, sqlglot, httpx, psutil, asyncio, ...) into the fork server and so into every
worker: three times the worker's resident memory, counted against `memoryMb`, and native code
no plugin needs within an attacker's reach.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from suaveplan_sandbox.vm._sandbox import (
        BlockingVmSandbox,
        VmSandbox,
        create_vm_sandbox,
        create_vm_sandbox_sync,
    )

__all__ = ["BlockingVmSandbox", "VmSandbox", "create_vm_sandbox", "create_vm_sandbox_sync"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from suaveplan_sandbox.vm import _sandbox

        value = getattr(_sandbox, name)
        globals()[name] = value  # later lookups are plain module attributes
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
