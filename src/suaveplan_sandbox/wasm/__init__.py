"""Run WASI preview 1 modules under wasmtime with exactly the capabilities the policy grants."""

from suaveplan_sandbox.wasm._blocking import BlockingWasmSandbox, create_wasm_sandbox_blocking
from suaveplan_sandbox.wasm._compile_bounds import CompileLimits
from suaveplan_sandbox.wasm._errno import Errno
from suaveplan_sandbox.wasm._sandbox import (
    PreopenSpec,
    RunResult,
    WasmSandbox,
    create_wasm_sandbox,
)

__all__ = [
    "BlockingWasmSandbox",
    "CompileLimits",
    "Errno",
    "PreopenSpec",
    "RunResult",
    "WasmSandbox",
    "create_wasm_sandbox",
    "create_wasm_sandbox_blocking",
]
