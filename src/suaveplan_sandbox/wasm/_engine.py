"""One wasmtime Engine per process, the module caches, and the one translation point.

Theory of operation: `engine()` builds the process-wide Engine lazily with epoch interruption
on; a daemon ticker thread bumps its epoch every `TICK_S`, so a store's epoch deadline is a
wall-clock budget in ticks. `load_module(path, limits=...)` hashes the bytes; a module cached
for that hash is returned if its `CompileShape` is within the caller's `CompileLimits` (the
cache never widens a host's bounds). Otherwise it validates the bytes, refuses them if
compiling could cost too much (`_compile_bounds`, the cheap first gate), rewrites them so
refused `memory.grow`s are recorded (`_instrument`; the original is kept when it cannot be
instrumented), and gets the bytes that will run compiled: from the host's disk cache when
`cache_dir` holds an artefact named by the sha256 of those bytes (and the config's hash),
else by a compile child (`_compile_child`, under the limits' memory and CPU caps) — the
host never runs Cranelift on a guest's bytes. Either way the host only deserializes.
`load_module_file` refuses a file larger than `max_bytes` before reading it; `has_start` says
whether instantiating a module runs guest code (a start function). `check_imports` checks the
import list (WASI version) before instantiation.

Loads of the same bytes share one load (`_flights`): the first does the work, the others wait
for it and then read the caches under their own limits (and load afresh if its failure was
one the caches do not keep). Loads of other bytes never wait for it: no lock is held while
validating, walking, rewriting or compiling, and the compile pool has a second child.

Refusals are cached too (`_refusals`, by sha256, least recently used first out past
`MAX_REFUSALS`), for exactly as much as each depends on, so a cached refusal is the answer a
new load would give:

| refused because                                 | a hit needs the same                   |
|-------------------------------------------------|----------------------------------------|
| wasmtime finds the bytes invalid                | (nothing)                              |
| over a header bound (`details.stage="bounds"`)  | header bounds (`CompileLimits.max_*`)  |
| wasmtime would not compile valid bytes          | `memory_bytes` and `cpu_seconds`; and  |
| (`compile-failed`)                              | the module's shape is judged by the    |
|                                                 | asking bounds first, as a cached one's |

A compile failure is held to the memory and CPU it was refused under because wasmtime
reports some failures for want of memory (an mmap refused under RLIMIT_AS) as an error, not an
abort: more memory might compile it. Not cached: a compile child that died or timed out (out
of memory or CPU, killed, starved — the machine's state as much as the module's), and
anything the host did wrong. A cached
refusal raises a fresh error each time, with wasmtime's reason chained again.
`translate(exc)` is the only place wasmtime exceptions become coded errors; a trap names its
kind (`details.trap`, the `TrapCode`, never the guest's text). A coded error is chained to
`guest_cause(exc)`, never to wasmtime's own error: its message quotes names the guest chose.
"""

from __future__ import annotations

import enum
import hashlib
import importlib.metadata as _metadata
import os
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

import wasmtime

from suaveplan_sandbox._printable import printable
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.wasm._compile_bounds import (
    DEFAULT_COMPILE_LIMITS,
    CompileLimits,
    CompileShape,
    bound_values,
    check_compile_bounds,
    check_compile_shape,
)
from suaveplan_sandbox.wasm._compile_child import compile_server
from suaveplan_sandbox.wasm._compile_wire import Refused
from suaveplan_sandbox.wasm._engine_config import SETTINGS_TAG, engine_config
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
# The engine's reviewed settings (`ENGINE_SETTINGS`) and `engine_config()` live in
# `_engine_config`, which the compile child loads too: both engines come from the one table.
# A serialized module is only valid for the engine (wasmtime version + config) that wrote it,
# so the artefact name carries the version and a short hash of `ENGINE_SETTINGS`: an artefact
# compiled under any other config (say, before a proposal was turned off) is never loaded.
_SETTINGS_TAG: Final = SETTINGS_TAG
_ARTEFACT_SUFFIX: Final = f".wasmtime-{_metadata.version('wasmtime')}-{_SETTINGS_TAG}.cwasm"

# How many compiled modules `_modules` keeps, and file identities `_digests`: a long-lived
# host loading one module after another (every upload a new version) must not grow without
# bound. The least recently used goes first; a module dropped here is compiled again (or
# read from `cache_dir`) on its next load, and a sandbox running it holds its own reference.
MAX_MODULES: Final = 128
MAX_FILE_DIGESTS: Final = 4096

_lock = threading.Lock()
# sha256 of a module's bytes -> the compiled module. LRU, at most `MAX_MODULES`.
_modules: OrderedDict[str, wasmtime.Module] = OrderedDict()
# sha256 of a module's bytes -> its `CompileShape`, kept beside `_modules` (and dropped with
# it) so a cache hit is judged by the asking host's bounds without the bytes.
_shapes: dict[str, CompileShape] = {}
# File identity -> sha256 of the bytes last read from it, so a create of an unchanged file
# skips reading and hashing it. ctime changes on every write (and cannot be set back by the
# writer), so a rewritten file never matches its old identity. LRU, `MAX_FILE_DIGESTS`.
_digests: OrderedDict[tuple[int, int, int, int, int], str] = OrderedDict()
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
# How many refusals `_refusals` keeps (each a few KB at most: a code, details, wasmtime's
# reason as `guest_cause` cuts it, and a shape).
MAX_REFUSALS: Final = 1024


class _DependsOn(enum.Enum):
    """What a refusal depends on besides the bytes; see the module docstring."""

    NOTHING = "nothing"
    BOUNDS = "bounds"
    RESOURCES = "resources"

    def key(self, limits: CompileLimits) -> tuple[int, ...]:
        if self is _DependsOn.BOUNDS:
            return bound_values(limits)
        if self is _DependsOn.RESOURCES:
            return (limits.memory_bytes, limits.cpu_seconds)
        return ()


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _Refusal:
    """A refused module's answer, held for the limits it depends on (`under`)."""

    code: str
    message: str
    details: tuple[tuple[str, WireValue], ...]
    reason: str | None  # wasmtime's, as `guest_cause` shows it; chained on every answer
    depends: _DependsOn
    under: tuple[int, ...]
    shape: CompileShape | None  # within the bounds it was refused under; None: not walked

    def holds_for(self, limits: CompileLimits) -> bool:
        return self.depends.key(limits) == self.under

    def error(self) -> SuaveplanError:
        error = SuaveplanError(self.code, self.message, dict(self.details))
        if self.reason is not None:
            error.__cause__ = wasmtime.WasmtimeError(self.reason)
        return error


# sha256 of refused bytes -> the refusal (one per module: a newer one replaces it). LRU.
_refusals: OrderedDict[str, _Refusal] = OrderedDict()


@final
class _Flight:
    """A load of new bytes in progress; loads of the same bytes wait for it (`joined`)."""

    __slots__ = ("done", "joined")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.joined = 0


# sha256 -> the load of those bytes in progress.
_flights: dict[str, _Flight] = {}


class _State:
    engine: wasmtime.Engine | None = None
    compiles = 0  # compiles this process asked its compile child for; read by tests, benchmarks


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


def _tick(eng: wasmtime.Engine) -> None:
    while True:
        time.sleep(TICK_S)
        eng.increment_epoch()


# How much of wasmtime's message a coded error's cause keeps (`guest_cause`).
MAX_CAUSE_CHARS: Final = 2048


def guest_cause(exc: BaseException) -> wasmtime.WasmtimeError | wasmtime.Trap:
    """What a coded error from wasmtime's `exc` is chained to: an error of its kind
    (`wasmtime.Trap` for a trap, else `wasmtime.WasmtimeError`) carrying its message cut to
    `MAX_CAUSE_CHARS` and made printable on one line.

    wasmtime's own error is never chained: its message quotes the module's backtrace with
    the names in its name section, text the guest chose, of any length, with terminal escape
    sequences and newlines that would forge lines in a host log that prints the cause chain
    (`logger.exception`, a formatted traceback)."""
    text = str(exc)
    cut = len(text) - MAX_CAUSE_CHARS
    shown = printable(text[:MAX_CAUSE_CHARS])[:MAX_CAUSE_CHARS]
    if cut > 0:
        shown += f" ... ({cut} more characters)"
    if isinstance(exc, wasmtime.Trap):
        return wasmtime.Trap(shown)
    return wasmtime.WasmtimeError(shown)


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
    if during == "compile":
        # wasmtime could not compile bytes it validated (a limit of its own).
        return SuaveplanError(
            "SAND_WASM_INSTANTIATION_FAILED",
            "the module could not be compiled",
            {"stage": "compile", "reason": "compile-failed"},
        )
    if during == "deserialize":
        # The compile child's artefact does not load here: treated as a malformed reply.
        return SuaveplanError(
            "SAND_WASM_INSTANTIATION_FAILED",
            "the module could not be compiled",
            {"stage": "compile", "reason": "compile-reply-malformed", "why": "deserialize"},
        )
    if during == "instantiate":
        return SuaveplanError(
            "SAND_WASM_INSTANTIATION_FAILED",
            "the module could not be compiled or instantiated",
            {"stage": during},
        )
    details: dict[str, WireValue] = {"stage": during}
    code = exc.trap_code if isinstance(exc, wasmtime.Trap) else None
    if code is not None:
        # The kind only: the trap's message carries the guest's function names.
        details["trap"] = code.name.lower().replace("_", "-")
    return SuaveplanError("SAND_WASM_TRAP", "the guest trapped", details)


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


def _lookup(digest: str, limits: CompileLimits) -> wasmtime.Module | None:
    """The cached answer for `digest` under `limits`: a module (None if none is cached), or
    a cached refusal raised afresh. A cached module's shape, and a cached compile failure's,
    are judged by `limits`' bounds first."""
    with _lock:
        module, shape = _modules.get(digest), _shapes.get(digest)
        refusal = None
        if module is not None and shape is not None:
            _modules.move_to_end(digest)
        else:
            module = None
            refusal = _refusals.get(digest)
            if refusal is not None:
                if not refusal.holds_for(limits):
                    refusal = None
                else:
                    _refusals.move_to_end(digest)
    if module is not None and shape is not None:
        check_compile_shape(shape, limits)
        return module
    if refusal is not None:
        if refusal.shape is not None:
            check_compile_shape(refusal.shape, limits)
        raise refusal.error()
    return None


def _cached(digest: str | None, limits: CompileLimits) -> wasmtime.Module | None:
    """The cached module for `digest`, if any; raises if it is refused under `limits`."""
    return None if digest is None else _lookup(digest, limits)


def _answered(digest: str, limits: CompileLimits) -> bool:
    """Under `_lock`: whether `_lookup(digest, limits)` would answer from a cache."""
    if digest in _modules and digest in _shapes:
        return True
    refusal = _refusals.get(digest)
    return refusal is not None and refusal.holds_for(limits)


def _refuse(
    digest: str,
    error: SuaveplanError,
    reason: BaseException | None,
    limits: CompileLimits,
    depends: _DependsOn,
    *,
    shape: CompileShape | None = None,
) -> SuaveplanError:
    """Remember `error` as the answer for `digest` (see the module docstring); returns it."""
    refusal = _Refusal(
        code=error.code,
        message=error.message,
        details=tuple(error.details.items()),
        reason=None if reason is None else str(guest_cause(reason)),
        depends=depends,
        under=depends.key(limits),
        shape=shape,
    )
    with _lock:
        _refusals[digest] = refusal
        _refusals.move_to_end(digest)
        while len(_refusals) > MAX_REFUSALS:
            _refusals.popitem(last=False)
    return error


def cached_module_file(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = DEFAULT_MAX_MODULE_BYTES,
    limits: CompileLimits = DEFAULT_COMPILE_LIMITS,
) -> wasmtime.Module | None:
    """The compiled module of an unchanged file loaded before (within `max_bytes` and the
    bounds of `limits`), else None.

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
    try:
        return _cached(digest, limits)
    except SuaveplanError:
        return None


def load_module_file(
    path: str | os.PathLike[str],
    *,
    cache_dir: Path | None = None,
    max_bytes: int = DEFAULT_MAX_MODULE_BYTES,
    limits: CompileLimits = DEFAULT_COMPILE_LIMITS,
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
        cached = _cached(digest, limits)
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
    # Recorded before the load, so that a refused file is not read again either.
    with _lock:
        _digests[key] = hashlib.sha256(wasm).hexdigest()
        _digests.move_to_end(key)
        while len(_digests) > MAX_FILE_DIGESTS:
            _digests.popitem(last=False)
    return load_module(wasm, cache_dir=cache_dir, limits=limits)


def load_module(
    wasm: bytes, *, cache_dir: Path | None = None, limits: CompileLimits = DEFAULT_COMPILE_LIMITS
) -> wasmtime.Module:
    """Compile (or fetch from cache) the module for these bytes, within `limits`."""
    digest = hashlib.sha256(wasm).hexdigest()
    while True:
        cached = _lookup(digest, limits)
        if cached is not None:
            return cached
        with _lock:
            flight = _flights.get(digest)
            if flight is None:
                if _answered(digest, limits):
                    continue  # cached since the lookup: read it
                flight = _flights[digest] = _Flight()
                break
            flight.joined += 1
        flight.done.wait()
    try:
        return _load_new(wasm, digest, cache_dir, limits)
    finally:
        with _lock:
            del _flights[digest]
        flight.done.set()


def _load_new(
    wasm: bytes, digest: str, cache_dir: Path | None, limits: CompileLimits
) -> wasmtime.Module:
    """`load_module` of bytes no cache answers for `limits`; caches the answer."""
    eng = engine()
    # Validate what the guest sent before anything else reads it: wasmtime's validator is
    # linear and off the GIL; the bounds walk below may then trust the structure; and the
    # rewrite must never turn an invalid module (one naming an index only the appended
    # items would make valid) into a valid one.
    try:
        wasmtime.Module.validate(eng, wasm)
    except wasmtime.WasmtimeError as exc:
        error = translate(exc, during="instantiate")
        raise _refuse(digest, error, exc, limits, _DependsOn.NOTHING) from guest_cause(exc)
    # Before the Python walks below, before the disk cache and before compiling.
    try:
        shape = check_compile_bounds(wasm, limits)
    except SuaveplanError as error:
        _refuse(digest, error, None, limits, _DependsOn.BOUNDS)
        raise
    starts = declares_start(wasm)
    outcome = instrument(wasm)
    source = wasm
    if isinstance(outcome, Instrumented):
        source = outcome.wasm
    try:
        try:
            module = _compile(eng, source, cache_dir, limits)
        except wasmtime.WasmtimeError as exc:
            if source is wasm:
                raise translate(exc, during="instantiate") from guest_cause(exc)
            # wasmtime refused our rewrite of a valid module (a walker bug, never the
            # guest's): run the original, judged by inference.
            outcome = NotInstrumented(reason=Skip.REJECTED, detail="the rewritten module")
            try:
                module = _compile(eng, wasm, cache_dir, limits)
            except wasmtime.WasmtimeError as again:  # pragma: no cover — it validated above
                raise translate(again, during="instantiate") from guest_cause(again)
    except SuaveplanError as error:
        if error.details.get("reason") == "compile-failed":
            # wasmtime's own answer, under these memory and CPU limits (an mmap refused
            # under RLIMIT_AS is one too): the same limits get the same answer.
            _refuse(digest, error, error.__cause__, limits, _DependsOn.RESOURCES, shape=shape)
        raise
    with _lock:
        module = _modules.setdefault(digest, module)
        _modules.move_to_end(digest)
        _shapes[digest] = shape
        while len(_modules) > MAX_MODULES:
            dropped, _ = _modules.popitem(last=False)
            _shapes.pop(dropped, None)
        _refusals.pop(digest, None)
        _grow.setdefault(module, outcome)
        _starts.setdefault(module, starts)
        return module


def _compile(
    eng: wasmtime.Engine, source: bytes, cache_dir: Path | None, limits: CompileLimits
) -> wasmtime.Module:
    """`source` read back from the disk cache, else compiled by the compile child.

    Raises wasmtime's error when wasmtime refuses `source` (invalid bytes), and the coded
    `details.stage="compile"` errors when the compile fails or its child dies.
    """
    artefact = None
    if cache_dir is not None:
        artefact = cache_dir / (hashlib.sha256(source).hexdigest() + _ARTEFACT_SUFFIX)
    if artefact is not None and artefact.is_file():
        # SECURITY: deserialize runs native code compiled earlier; wasmtime does not validate
        # it. We only ever read files the host itself wrote into its own cache dir (named by
        # the sha256 of the bytes it compiled); never point cache_dir at a location a plugin
        # or another user can write.
        try:
            return wasmtime.Module.deserialize(eng, artefact.read_bytes())
        except (wasmtime.WasmtimeError, OSError):
            pass
    # The child stays ours until its artefact has loaded: one that sent a bad one is stopped
    # before it serves anyone else, and no other load's compile is disturbed.
    with compile_server().reserve() as child:
        reply = child.compile(
            source, memory_bytes=limits.memory_bytes, cpu_seconds=limits.cpu_seconds
        )
        if isinstance(reply, Refused):
            refusal = wasmtime.WasmtimeError(reply.message)  # wasmtime's own reason, relayed
            if not reply.valid:
                raise refusal
            raise translate(refusal, during="compile") from guest_cause(refusal)
        # SECURITY: the same trust as the disk cache above, for the same reason: these bytes
        # are the host's own compile of `source`. They come from a compile child — the
        # host's own interpreter running our code, which built its engine from
        # `engine_config()` and said so before its first compile — over a socketpair no other
        # process holds, tagged with the sha256 of `source`; the child only moves where the
        # compiler runs. (A compiler bug a module could exploit would control these bytes as
        # surely as an in-process compile's.)
        try:
            module = wasmtime.Module.deserialize(eng, reply.artefact)
        except wasmtime.WasmtimeError as exc:
            child.close()
            raise translate(exc, during="deserialize") from guest_cause(exc)
    with _lock:
        _State.compiles += 1
    if artefact is not None:
        try:
            artefact.parent.mkdir(parents=True, exist_ok=True)
            tmp = artefact.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(reply.artefact)
            tmp.replace(artefact)
        except OSError:
            pass
    return module
