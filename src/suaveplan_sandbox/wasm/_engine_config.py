"""The wasmtime `Config` every engine we build uses: the host's, and the compile child's.

A leaf module (it imports only wasmtime and the standard library) so that the compile child
(`_compile_child_main`) builds its engine from this very table and function without loading
the rest of the package. An artefact is only valid for the engine that wrote it: the host
deserializes what the child compiled, so both must apply exactly `ENGINE_SETTINGS`.
"""

from __future__ import annotations

import hashlib
from typing import Final

import wasmtime

# Every wasmtime `Config` setting the engine makes, in one reviewed table (`engine_config()`
# applies exactly these). Fail closed: each proposal wasmtime-py can switch is named, and only
# what the WASI toolchains we support emit is on — the Wasm 2.0 baseline of wasi-sdk, Rust
# (wasm32-wasip1), TinyGo and Zig: bulk memory (our C fixtures and example need it),
# multi-value, reference types (call_indirect's table-index encoding; wasmtime 51 also crashes
# the process validating our fixtures with it off) and SIMD. Sign-extension, non-trapping
# float-to-int, mutable globals and extended-const have no switch: wasmtime always accepts
# them. Off, each unreviewed: threads and shared memory (a shared memory grows outside the
# store's limiter); tail calls, exceptions/exnref, function references, GC (GC objects live in
# a heap that memoryMb does not count), wide arithmetic, memory64, multi-memory (memoryMb is
# enforced per memory), relaxed SIMD (results differ between hosts), custom page sizes, stack
# switching and the component model. `parallel_compilation` is off so a compile keeps one
# core (of the two we plan for) free for the host, and the compile child stays one thread
# (docs/wasm-abi.md, Module size).
ENGINE_SETTINGS: Final[tuple[tuple[str, bool], ...]] = (
    ("epoch_interruption", True),
    ("parallel_compilation", False),
    ("wasm_bulk_memory", True),
    ("wasm_multi_value", True),
    ("wasm_reference_types", True),
    ("wasm_simd", True),
    ("shared_memory", False),
    ("wasm_threads", False),
    ("wasm_tail_call", False),
    ("wasm_exceptions", False),
    ("wasm_function_references", False),
    ("wasm_gc", False),
    ("wasm_wide_arithmetic", False),
    ("wasm_memory64", False),
    ("wasm_multi_memory", False),
    ("wasm_relaxed_simd", False),
    ("wasm_custom_page_sizes", False),
    ("wasm_stack_switching", False),
    ("wasm_component_model", False),
    ("wasm_component_model_map", False),
    ("wasm_component_model_implements", False),
)
# A short hash of the whole table: names disk-cache artefacts (with the wasmtime version), and
# the compile child reports it when it starts so the host can check the child built the same
# engine before trusting anything it compiles.
SETTINGS_TAG: Final = hashlib.sha256(repr(ENGINE_SETTINGS).encode()).hexdigest()[:12]


def engine_config() -> wasmtime.Config:
    """A fresh `wasmtime.Config` with exactly `ENGINE_SETTINGS` applied."""
    config = wasmtime.Config()
    for name, value in ENGINE_SETTINGS:
        # A setting this wasmtime-py does not have would silently become a plain attribute
        # (fail open): refuse to build an engine instead.
        if not isinstance(getattr(wasmtime.Config, name, None), property):
            raise RuntimeError(f"wasmtime.Config has no setting {name!r}")
        setattr(config, name, value)
    return config
