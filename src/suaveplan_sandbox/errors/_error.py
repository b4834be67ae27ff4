"""`SuaveplanError`: the one exception type, and its plain-data wire form."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Final

from suaveplan_sandbox.errors._registry import is_registered

# A cause chain deeper than this from the wire is cut: a guest cannot make the host recurse.
MAX_CAUSE_DEPTH: Final = 16
_MAX_MESSAGE: Final = 4096
_MAX_DETAIL_ITEMS: Final = 64
# Characters of text (messages, detail strings and keys, each item counting one more) one
# error rebuilt from the wire keeps, cause chain included: the per-field cuts alone let a
# 16 MiB frame through whole (64 keys of 64 strings of 4 KiB), and the host scrubs every
# character of it for secret values on its loop (seconds for a 64-character value).
MAX_WIRE_ERROR_TEXT: Final = 64 * 1024

WireValue = None | bool | int | float | str | list["WireValue"] | dict[str, "WireValue"]


class SuaveplanError(Exception):
    """An error with a registered `code`, a human `message`, plain-data `details` and a `cause`.

    `details` must be plain data (str, int, float, bool, None, lists and str-keyed dicts of
    those) so that the error can cross a process boundary unchanged. Subclasses are not used
    for dispatch: match on `code`.
    """

    code: str
    message: str
    details: dict[str, WireValue]

    def __init__(
        self,
        code: str,
        message: str,
        details: Mapping[str, WireValue] | None = None,
        cause: BaseException | None = None,
    ) -> None:
        if not is_registered(code):
            raise ValueError(f"unregistered error code {code!r}; register it with define_codes")
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = dict(details or {})
        if cause is not None:
            self.__cause__ = cause

    @property
    def cause(self) -> BaseException | None:
        return self.__cause__

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"

    def __repr__(self) -> str:
        return (
            f"SuaveplanError(code={self.code!r}, message={self.message!r}, "
            f"details={self.details!r})"
        )

    def to_wire(self) -> dict[str, WireValue]:
        """Plain data for msgpack/JSON: code, message, details and the cause chain."""
        return _to_wire(self, 0)

    @classmethod
    def from_wire(cls, data: object) -> SuaveplanError:
        """Rebuild an error from `to_wire()` data received from an untrusted peer.

        Never raises for malformed input: anything unexpected becomes `SAND_WIRE_ERROR`, and an
        unknown code becomes `SAND_UNKNOWN_ERROR` with the original kept in details. No class
        named by the peer is ever instantiated.
        """
        return _from_wire(data, 0)


def _to_wire(exc: BaseException, depth: int) -> dict[str, WireValue]:
    if isinstance(exc, SuaveplanError):
        out: dict[str, WireValue] = {
            "code": exc.code,
            "message": exc.message,
            "details": _plain(exc.details, 0, _Room(_UNBOUNDED)),
        }
    else:
        out = {
            "code": "SAND_UNKNOWN_ERROR",
            "message": f"{type(exc).__name__}",
            "details": {"type": type(exc).__name__},
        }
    cause = exc.__cause__
    if cause is not None and depth + 1 < MAX_CAUSE_DEPTH:
        out["cause"] = _to_wire(cause, depth + 1)
    return out


def _malformed(what: str) -> SuaveplanError:
    return SuaveplanError("SAND_WIRE_ERROR", f"malformed error on the wire: {what}")


class _Room:
    """What is left of one wire error's `MAX_WIRE_ERROR_TEXT`, shared by its cause chain."""

    __slots__ = ("left",)

    def __init__(self, left: int = MAX_WIRE_ERROR_TEXT) -> None:
        self.left = left

    def text(self, value: str, limit: int) -> str:
        kept = value[: max(0, min(limit, self.left))]
        self.left -= len(kept) + 1
        return kept


# No bound but the per-field ones: what this process's own errors send (`to_wire`).
_UNBOUNDED: Final = sys.maxsize


def _plain(value: object, depth: int, room: _Room) -> WireValue:
    """Wire-safe plain data (each string, list and map cut, 8 levels deep, anything else its
    type's name), within `room`: once it is used up, strings are empty and containers end
    (so from the wire also at most `MAX_WIRE_ERROR_TEXT` items in all)."""
    if depth > 8:
        return None
    if value is None or isinstance(value, bool | int | float):
        room.left -= 1
        return value
    if isinstance(value, str):
        return room.text(value, _MAX_MESSAGE)
    if isinstance(value, list | tuple):
        items: list[WireValue] = []
        for item in value[:_MAX_DETAIL_ITEMS]:
            if room.left <= 0:
                break
            items.append(_plain(item, depth + 1, room))
        return items
    if isinstance(value, dict):
        entries: dict[str, WireValue] = {}
        for count, (key, item) in enumerate(value.items()):
            if count >= _MAX_DETAIL_ITEMS or room.left <= 0:
                break
            entries[room.text(str(key), 256)] = _plain(item, depth + 1, room)
        return entries
    room.left -= 1
    return type(value).__name__


def _from_wire(data: object, depth: int, room: _Room | None = None) -> SuaveplanError:
    room = room or _Room()
    if not isinstance(data, dict):
        return _malformed("not a map")
    code = data.get("code")
    message = data.get("message")
    details = data.get("details", {})
    if not isinstance(code, str) or not isinstance(message, str):
        return _malformed("code and message must be strings")
    if not isinstance(details, dict):
        return _malformed("details must be a map")
    message = room.text(message, _MAX_MESSAGE)
    plain_details = _plain(details, 0, room)
    assert isinstance(plain_details, dict)
    if not is_registered(code):
        plain_details = {**plain_details, "original_code": code[:128]}
        code = "SAND_UNKNOWN_ERROR"
    err = SuaveplanError(code, message, plain_details)
    cause = data.get("cause")
    if cause is not None and depth + 1 < MAX_CAUSE_DEPTH and room.left > 0:
        err.__cause__ = _from_wire(cause, depth + 1, room)
    return err


def error_from_wire(data: Any) -> SuaveplanError:
    """Functional spelling of `SuaveplanError.from_wire`."""
    return SuaveplanError.from_wire(data)
