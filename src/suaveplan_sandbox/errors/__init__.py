"""One exception type with registered codes, and its wire form."""

from suaveplan_sandbox.errors._codes import CODES
from suaveplan_sandbox.errors._error import SuaveplanError, WireValue, error_from_wire
from suaveplan_sandbox.errors._registry import (
    ErrorCode,
    define_codes,
    is_registered,
    registered_codes,
)

__all__ = [
    "CODES",
    "ErrorCode",
    "SuaveplanError",
    "WireValue",
    "define_codes",
    "error_from_wire",
    "is_registered",
    "registered_codes",
]
