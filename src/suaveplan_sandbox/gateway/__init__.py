"""The single gateway every guest capability request passes through."""

from suaveplan_sandbox.gateway._gateway import (
    DEFAULT_MAX_READ_BYTES,
    DEFAULT_MAX_WRITE_BYTES,
    DenialListener,
    Gateway,
)

__all__ = ["DEFAULT_MAX_READ_BYTES", "DEFAULT_MAX_WRITE_BYTES", "DenialListener", "Gateway"]
