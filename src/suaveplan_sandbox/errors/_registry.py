"""The registry of error codes: every code a `SuaveplanError` may carry is defined here first."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, final

_CODE_SHAPE: Final = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorCode:
    """One registered code: its name, what it means, and who registered it."""

    code: str
    description: str
    owner: str


_lock = threading.Lock()
_codes: dict[str, ErrorCode] = {}


def define_codes(owner: str, codes: Mapping[str, str]) -> Mapping[str, str]:
    """Register `codes` (code -> description) under `owner` and return a frozen code map.

    Codes are SCREAMING_SNAKE with at least one underscore. Re-registering a code with the same
    owner and description is a no-op (module reloads); a conflicting definition raises
    `ValueError`, so two packages cannot silently claim one code.
    """
    out: dict[str, str] = {}
    with _lock:
        for code, description in codes.items():
            if not _CODE_SHAPE.match(code):
                raise ValueError(f"error code {code!r} is not SCREAMING_SNAKE_CASE")
            entry = ErrorCode(code=code, description=description, owner=owner)
            existing = _codes.get(code)
            if existing is not None and existing != entry:
                raise ValueError(f"error code {code!r} is already defined by {existing.owner!r}")
            _codes[code] = entry
            out[code] = code
    return MappingProxyType(out)


def registered_codes() -> Mapping[str, ErrorCode]:
    """A snapshot of every registered code, sorted by name."""
    with _lock:
        return MappingProxyType(dict(sorted(_codes.items())))


def is_registered(code: str) -> bool:
    return code in _codes
