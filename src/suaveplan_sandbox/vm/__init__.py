"""Python plugins in hardened worker processes forked from a clean fork server."""

from suaveplan_sandbox.vm._sandbox import (
    BlockingVmSandbox,
    VmSandbox,
    create_vm_sandbox,
    create_vm_sandbox_sync,
)

__all__ = ["BlockingVmSandbox", "VmSandbox", "create_vm_sandbox", "create_vm_sandbox_sync"]
