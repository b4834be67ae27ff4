"""One wasmtime Engine per process, a compiled-module cache, and the one translation point.

Theory of operation: `engine()` builds the process-wide Engine lazily with epoch interruption
on; a daemon ticker thread bumps its epoch every `TICK_S`, so a store's epoch deadline is a
wall-clock budget in ticks. `load_module(path)` hashes the bytes, returns the cached compiled
module for that hash, else validates it, refuses it if compiling it could cost the host too
much (`_compile_bounds`), rewrites it so refused `memory.grow`s are recorded (`_instrument`;
the original is kept when it cannot be instrumented), compiles the bytes that will run, and
optionally writes the serialized artefact, named by the sha256 of those bytes (and the
config's hash), into the host's cache dir. `load_module_file` refuses a file
larger than `max_bytes` before reading it; `has_start` says whether instantiating a module
runs guest code (a start function). `check_imports` checks the import list (WASI version)
before instantiation.
`translate(exc)` is the only place wasmtime exceptions become coded errors.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as _metadata
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Final

import wasmtime

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.wasm._compile_bounds import check_compile_bounds
from suaveplan_sandbox.wasm._instrument import (
    Instrumented,
    NotInstrumented,
    Skip,
    declares_start,
    instrument,
)

TICK_S: Final = 0.005
# The largest module file `load_module_file` reads by default (`max_module_bytes`).
DEFAULT_MAX_MODULE_BYTES: Final = 128 * 1024 * 1024
SUPPORTED_WASI: Final = "wasi_snapshot_preview1"
HOST_MODULE: Final = "suaveplan"
UNSUPPORTED_WASI: Final = frozenset({"wasi_unstable", "wasi_snapshot_preview0", "wasi"})
# Every wasmtime `Config` setting the engine makes, in one reviewed table (`engine()` applies
# exactly these). Fail closed: each proposal wasmtime-py can switch is named, and only what
# the WASI toolchains we support emit is on — the Wasm 2.0 baseline of wasi-sdk, Rust
# (wasm32-wasip1), TinyGo and Zig: bulk memory (our C fixtures and example need it), multi-value,
# reference types (call_indirect's table-index encoding; wasmtime 51 also crashes the process
# validating our fixtures with it off) and SIMD. Sign-extension, non-trapping float-to-int,
# mutable globals and extended-const have no switch: wasmtime always accepts them. Off, each
# unreviewed: threads and shared memory (a shared memory grows outside the store's limiter);
# tail calls, exceptions/exnref, function references, GC (GC objects live in a heap that
# memoryMb does not count), wide arithmetic, memory64, multi-memory (memoryMb is enforced per
# memory), relaxed SIMD (results differ between hosts), custom page sizes, stack switching
# and the component model. `parallel_compilation` is off so compiling a new module keeps one
# core (of the two we plan for) free for the host (docs/wasm-abi.md, Module size).
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
# A serialized module is only valid for the engine (wasmtime version + config) that wrote it,
# so the artefact name carries the version and a short hash of `ENGINE_SETTINGS`: an artefact
# compiled under any other config (say, before a proposal was turned off) is never loaded.
_SETTINGS_TAG: Final = hashlib.sha256(repr(ENGINE_SETTINGS).encode()).hexdigest()[:12]
_ARTEFACT_SUFFIX: Final = f".wasmtime-{_metadata.version('wasmtime')}-{_SETTINGS_TAG}.cwasm"

_lock = threading.Lock()
_modules: dict[str, wasmtime.Module] = {}
# File identity -> sha256 of the bytes last read from it, so a create of an unchanged file
# skips reading and hashing it. ctime changes on every write (and cannot be set back by the
# writer), so a rewritten file never matches its old identity.
_digests: dict[tuple[int, int, int, int, int], str] = {}
# Modules whose imports passed `check_imports` -> whether they import WASI preview 1.
_checked: weakref.WeakKeyDictionary[wasmtime.Module, bool] = weakref.WeakKeyDictionary()
# Compiled module -> how its memory.grow refusals are judged: `Instrumented` (exact; the
# module records refusals) or `NotInstrumented` (the host infers from sizes).
_grow: weakref.WeakKeyDictionary[wasmtime.Module, Instrumented | NotInstrumented] = (
    weakref.WeakKeyDictionary()
)
# Compiled module -> whether it has a start function (guest code that runs while it is
# instantiated; `has_start`).
_starts: weakref.WeakKeyDictionary[wasmtime.Module, bool] = weakref.WeakKeyDictionary()


class _State:
    engine: wasmtime.Engine | None = None
    compiles = 0  # compilations this process paid; read by tests and benchmarks


def compile_count() -> int:
    return _State.compiles


def grow_instrumentation(module: wasmtime.Module) -> Instrumented | NotInstrumented:
    """Whether `module` (from `load_module`) records refused grows, or why it does not."""
    with _lock:
        found = _grow.get(module)
    return found if found is not None else NotInstrumented(reason=Skip.REJECTED, detail="unknown")


def has_start(module: wasmtime.Module) -> bool:
    """Whether instantiating `module` (from `load_module`) runs guest code; True if unknown."""
    with _lock:
        found = _starts.get(module)
    return True if found is None else found


def engine() -> wasmtime.Engine:
    with _lock:
        if _State.engine is None:
            _State.engine = eng = wasmtime.Engine(engine_config())
            threading.Thread(
                target=_tick, args=(eng,), name="suaveplan-wasm-epoch", daemon=True
            ).start()
        return _State.engine


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


def _tick(eng: wasmtime.Engine) -> None:
    while True:
        time.sleep(TICK_S)
        eng.increment_epoch()


def translate(exc: BaseException, *, during: str) -> SuaveplanError:
    """The one place a wasmtime (or OS) error becomes a coded error; chain it with `from`."""
    if isinstance(exc, SuaveplanError):
        return exc
    if during == "preopen":
        return SuaveplanError(
            "SAND_WASM_PREOPEN_DENIED",
            "a preopen directory could not be opened",
            {"capability": "fs"},
        )
    if during == "instantiate":
        return SuaveplanError(
            "SAND_WASM_INSTANTIATION_FAILED",
            "the module could not be compiled or instantiated",
            {"stage": during},
        )
    return SuaveplanError("SAND_WASM_TRAP", "the guest trapped", {"stage": during})


def check_imports(module: wasmtime.Module) -> bool:
    """Refuse unsupported WASI versions before instantiation; True if it imports WASI p1.

    `wasi_unstable`, `wasi_snapshot_preview0` and any other `wasi*` module name are
    SAND_WASM_WASI_VERSION_UNSUPPORTED; any other unknown module name is
    SAND_WASM_INSTANTIATION_FAILED (an unresolvable import, not a WASI version). A module
    that passed is remembered (its imports cannot change); one that failed is re-checked
    and raises a fresh error every time.
    """
    with _lock:
        known = _checked.get(module)
    if known is not None:
        return known
    imports_wasi = False
    for imp in module.imports:
        name = imp.module
        if name == SUPPORTED_WASI:
            imports_wasi = True
            continue
        if name == HOST_MODULE:
            continue
        if name in UNSUPPORTED_WASI or name.startswith("wasi"):
            raise SuaveplanError(
                "SAND_WASM_WASI_VERSION_UNSUPPORTED",
                "the module imports an unsupported WASI version",
                {"module": name, "supported": [SUPPORTED_WASI]},
            )
        raise SuaveplanError(
            "SAND_WASM_INSTANTIATION_FAILED",
            "the module imports from an unknown module",
            {"module": name},
        )
    with _lock:
        _checked[module] = imports_wasi
    return imports_wasi


def _file_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _too_large(size: int, max_bytes: int) -> SuaveplanError:
    return SuaveplanError(
        "SAND_WASM_INSTANTIATION_FAILED",
        "the module file is larger than max_module_bytes",
        {"stage": "read", "limit": max_bytes},
    )


def cached_module_file(
    path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_MODULE_BYTES
) -> wasmtime.Module | None:
    """The compiled module of an unchanged file loaded before (within `max_bytes`), else None.

    Cheap (one stat); never raises: `load_module_file` reports what is wrong.
    """
    try:
        st = os.stat(path)  # noqa: PTH116 — on every create; building a Path costs more
    except OSError:
        return None
    if st.st_size > max_bytes:
        return None
    with _lock:
        digest = _digests.get(_file_key(st))
        return _modules.get(digest) if digest is not None else None


def load_module_file(
    path: str | os.PathLike[str],
    *,
    cache_dir: Path | None = None,
    max_bytes: int = DEFAULT_MAX_MODULE_BYTES,
) -> wasmtime.Module:
    """`load_module` of a file's bytes; an unchanged file is neither re-read nor re-hashed.

    A file larger than `max_bytes` is refused before it is read (and if it grew past it
    while being read): reading, rewriting and compiling cost host memory and time in
    proportion to bytes the plugin's author chose.
    """
    try:
        st = os.stat(path)  # noqa: PTH116 — on every create; building a Path costs more
        if st.st_size > max_bytes:
            raise _too_large(st.st_size, max_bytes)
        key = _file_key(st)
        with _lock:
            digest = _digests.get(key)
            cached = _modules.get(digest) if digest is not None else None
        if cached is not None:
            return cached
        with open(path, "rb") as fh:  # noqa: PTH123 — see above
            wasm = fh.read(max_bytes + 1)
        if len(wasm) > max_bytes:
            raise _too_large(len(wasm), max_bytes)
    except OSError as exc:
        raise SuaveplanError(
            "SAND_WASM_INSTANTIATION_FAILED", "the module file could not be read", {"stage": "read"}
        ) from exc
    module = load_module(wasm, cache_dir=cache_dir)
    with _lock:
        _digests[key] = hashlib.sha256(wasm).hexdigest()
    return module


def load_module(wasm: bytes, *, cache_dir: Path | None = None) -> wasmtime.Module:
    """Compile (or fetch from cache) the module for these bytes."""
    digest = hashlib.sha256(wasm).hexdigest()
    with _lock:
        cached = _modules.get(digest)
    if cached is not None:
        return cached
    eng = engine()
    # Validate what the guest sent before anything else reads it: wasmtime's validator is
    # linear and off the GIL; the bounds walk below may then trust the structure; and the
    # rewrite must never turn an invalid module (one naming an index only the appended
    # items would make valid) into a valid one.
    try:
        wasmtime.Module.validate(eng, wasm)
    except wasmtime.WasmtimeError as exc:
        raise translate(exc, during="instantiate") from exc
    check_compile_bounds(wasm)  # before the Python walks below and before compiling
    starts = declares_start(wasm)
    outcome = instrument(wasm)
    source = wasm
    if isinstance(outcome, Instrumented):
        source = outcome.wasm
    try:
        module = _compile(eng, source, cache_dir)
    except wasmtime.WasmtimeError as exc:
        if source is wasm:
            raise translate(exc, during="instantiate") from exc
        # wasmtime refused our rewrite of a valid module (a walker bug, never the guest's):
        # run the original, judged by inference.
        outcome = NotInstrumented(reason=Skip.REJECTED, detail="the rewritten module")
        try:
            module = _compile(eng, wasm, cache_dir)
        except wasmtime.WasmtimeError as again:  # pragma: no cover — it validated above
            raise translate(again, during="instantiate") from again
    with _lock:
        module = _modules.setdefault(digest, module)
        _grow.setdefault(module, outcome)
        _starts.setdefault(module, starts)
        return module


def _compile(eng: wasmtime.Engine, source: bytes, cache_dir: Path | None) -> wasmtime.Module:
    """`source` compiled (or read back from the disk cache); raises wasmtime's error."""
    module: wasmtime.Module | None = None
    artefact = None
    if cache_dir is not None:
        artefact = cache_dir / (hashlib.sha256(source).hexdigest() + _ARTEFACT_SUFFIX)
    if artefact is not None and artefact.is_file():
        # SECURITY: deserialize runs native code compiled earlier; wasmtime does not validate
        # it. We only ever read files the host itself wrote into its own cache dir (named by
        # the sha256 of the bytes it compiled); never point cache_dir at a location a plugin
        # or another user can write.
        try:
            module = wasmtime.Module.deserialize(eng, artefact.read_bytes())
        except (wasmtime.WasmtimeError, OSError):
            module = None
    if module is None:
        module = wasmtime.Module(eng, source)
        with _lock:
            _State.compiles += 1
        if artefact is not None:
            try:
                artefact.parent.mkdir(parents=True, exist_ok=True)
                tmp = artefact.with_suffix(f".tmp{os.getpid()}")
                tmp.write_bytes(bytes(module.serialize()))
                tmp.replace(artefact)
            except OSError:
                pass
    return module
