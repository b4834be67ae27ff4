"""Fork-server side: check and compile a plugin bundle in a short-lived, limited child.

CPython's parser costs far more memory than the source's size (`ast.parse` of a 4 MiB
`x = [a,a,...]` grows the parsing process by 2.7 GB; 4 MiB of ordinary code takes about
800 MB and 8 s of CPU to parse, check and compile), so untrusted source is parsed neither in
the host nor in the fork server itself, whose peak every worker would inherit. For a bundle
it has not compiled yet the fork server forks this child, which caps its address space at
`memory_bytes` above the fork server's own and its CPU time at `cpu_seconds`, hardens itself
like a worker (no fds but its reply pipe and its lifeline, no files, the seccomp allow list),
re-checks and compiles every module (`compile_bundle`) and writes one msgpack frame to its
pipe: the coded refusal as plain data, or each module's code object serialized with
`marshal`. The fork server bounds the frame (`MAX_REPLY_BYTES`), validates its shape and
caches what it loads. It does not wait for the child: `start_compile` returns a
`CompileChild` that the fork server's loop reads, times and reaps alongside its other work
(`compile_in_child` is the same, waited for). The child arms a lifeline pipe whose only
write end the fork server holds, so it dies with the fork server, and so with the host.

A child stopped by a limit, or one that dies or answers out of shape, is a coded refusal:
`SAND_VM_SYNTAX_FORBIDDEN` with `reason` `too-complex-to-compile` and `resource` one of
`memory`, `cpu`, `time` (the fork server's wall-clock safety net), `output` (a reply over the
bound) or `crashed`. Its memory dies with it, and the fork server carries on.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import resource
import select
import signal

# Imported here, in the fork server, because the hardened child cannot open a module file:
# the checker's format-string check imports `string` when it first meets a format string,
# and the parser imports `unicodedata` for a `\N{...}` escape. A lazy import added to the
# checker must join them (the guest tests, which create through this child, fail if not).
import string  # noqa: F401
import time
import types
import unicodedata  # noqa: F401
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, NoReturn

import msgpack

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._guest import CompiledBundle, PluginBundle, compile_bundle
from suaveplan_sandbox.vm._guest._runtime import CompiledModule
from suaveplan_sandbox.vm._hardening import (
    HardeningPlan,
    RlimitSettings,
    apply_hardening,
    arm_lifeline,
)

# Address space the child may map beyond the fork server's own, unless the load request
# names another (`ForkServer.load(compile_memory_mb=...)`). 4 MiB of ordinary code needs
# about 800 MB; dense source (a million names in one list, 800,000 one-line calls) several GB.
DEFAULT_COMPILE_MEMORY_MB: Final = 1024
MIN_COMPILE_MEMORY_MB: Final = 64
MAX_COMPILE_MEMORY_MB: Final = 64 * 1024
# CPU seconds the child may use (4 MiB of ordinary code: about 8 s here).
COMPILE_CPU_SECONDS: Final = 30
# Wall-clock safety net for a child that stops using CPU without ending (it runs no plugin
# code, so only an outside SIGSTOP or a kernel stall): generous, a loaded machine is slow.
COMPILE_WALL_SECONDS: Final = 4 * COMPILE_CPU_SECONDS + 30
# The largest reply the fork server reads: 4 MiB of ordinary code marshals to about 6 MB,
# 1.4 MB of `[a,a,...]` to 16 MB.
MAX_REPLY_BYTES: Final = 64 * 1024 * 1024
# The codes a compile child may answer with: the checker's verdicts and the loader's.
REFUSAL_CODES: Final = frozenset(
    {
        "SAND_INVALID_ARGUMENT",
        "SAND_VM_ATTRIBUTE_FORBIDDEN",
        "SAND_VM_EVAL_REJECTED",
        "SAND_VM_INDIRECT_EVAL_REJECTED",
        "SAND_VM_MODULE_IMPORT_FORBIDDEN",
        "SAND_VM_NAME_UNAVAILABLE",
        "SAND_VM_SYNTAX_FORBIDDEN",
    }
)
# A refusal sent on to the host fits one control message with room to spare.
_MAX_REFUSAL_BYTES: Final = 16 * 1024
_SYNTAX: Final = "SAND_VM_SYNTAX_FORBIDDEN"
_TOO_COMPLEX: Final = "too-complex-to-compile"
_EXIT_FAILED: Final = 3

# Compile children forked by this process (the fork server reports it in `pong`; tests
# count that a cache hit forks none).
forked_total = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CompileLimits:
    memory_bytes: int = DEFAULT_COMPILE_MEMORY_MB * 1024 * 1024
    cpu_seconds: int = COMPILE_CPU_SECONDS
    wall_seconds: float = COMPILE_WALL_SECONDS
    max_reply_bytes: int = MAX_REPLY_BYTES


def too_complex_to_compile(resource_name: str, **more: str | int) -> SuaveplanError:
    return SuaveplanError(
        _SYNTAX,
        "plugin source needs more than the sandbox allows to check and compile",
        {"reason": _TOO_COMPLEX, "resource": resource_name, **more},
    )


def compile_in_child(
    bundle: PluginBundle,
    limits: CompileLimits,
    *,
    plan: HardeningPlan | None,
    close_in_child: tuple[int, ...] = (),
) -> CompiledBundle:
    """Check and compile `bundle` in a limited child and wait for it (see the module
    docstring); the plugin's coded refusal is raised. The fork server does not wait: it
    drives `start_compile`'s child from its own loop. An OSError is a fork or pipe failure."""
    child = start_compile(bundle, limits, plan=plan, close_in_child=close_in_child)
    try:
        poller = select.poll()
        poller.register(child.reply_fd, select.POLLIN)
        while child.reading:
            poller.poll(max(0.0, child.deadline - time.monotonic()) * 1000)
            child.read()
            child.expire(time.monotonic())
        _, status, usage = os.wait4(child.pid, 0)
        child.reaped(status, usage)
        return child.outcome()
    finally:
        child.close()


def start_compile(
    bundle: PluginBundle,
    limits: CompileLimits,
    *,
    plan: HardeningPlan | None,
    close_in_child: tuple[int, ...] = (),
) -> CompileChild:
    """Fork the compile child for `bundle` and return at once (see `CompileChild`).

    `close_in_child`: fds of the fork server the child must not keep (its control socket
    above all, and other compile children's pipes). The child arms a lifeline whose only
    write end the fork server holds, so it dies with the fork server, busy or not (and so
    with the host). An OSError is a fork or pipe failure."""
    global forked_total  # noqa: PLW0603 - a per-process count
    base_vm, base_rss = _own_memory()
    r, w = os.pipe()
    try:
        lifeline_r, lifeline_w = os.pipe()
    except BaseException:
        os.close(r)
        os.close(w)
        raise
    try:
        pid = os.fork()
    except BaseException:
        for fd in (r, w, lifeline_r, lifeline_w):
            os.close(fd)
        raise
    if pid == 0:
        _child(bundle, w, lifeline_r, limits, base_vm, plan, (*close_in_child, r, lifeline_w))
    forked_total += 1
    os.close(w)
    os.close(lifeline_r)
    os.set_blocking(r, False)
    return CompileChild(
        bundle=bundle,
        limits=limits,
        pid=pid,
        reply_fd=r,
        lifeline_fd=lifeline_w,
        base_rss=base_rss,
        deadline=time.monotonic() + limits.wall_seconds,
    )


@dataclass(slots=True, eq=False, kw_only=True)
class CompileChild:
    """A running compile child, driven by its parent's loop: `read` whenever `reply_fd` is
    readable (the reply, read to EOF; past `max_reply_bytes` the child is killed, resource
    `output`), `expire` on each wake-up (past the wall-clock net it is killed, `time`),
    `reaped` with its wait status and resource usage; once `done`, `outcome()` is the
    compiled bundle or raises the coded refusal, and `close()` releases the fds."""

    bundle: PluginBundle
    limits: CompileLimits
    pid: int
    reply_fd: int  # -1 once read to EOF or given up
    lifeline_fd: int  # the write end of the child's lifeline; closing it kills the child
    base_rss: int
    deadline: float
    data: bytearray = field(default_factory=bytearray)
    stopped: str | None = None
    # (wait status, CPU seconds, peak resident bytes), once reaped.
    exit: tuple[int, float, int] | None = None

    @property
    def reading(self) -> bool:
        return self.reply_fd >= 0

    @property
    def done(self) -> bool:
        return self.reply_fd < 0 and self.exit is not None

    @property
    def fds(self) -> tuple[int, ...]:
        """The parent's fds of this child, which no other child of the parent may keep."""
        return tuple(fd for fd in (self.reply_fd, self.lifeline_fd) if fd >= 0)

    def read(self) -> None:
        """Take what the (non-blocking) reply pipe holds."""
        while self.reply_fd >= 0:
            try:
                chunk = os.read(self.reply_fd, 1 << 20)
            except BlockingIOError:
                return
            except OSError:
                self.stop("crashed")
                return
            if not chunk:
                self._close_reply()
                return
            self.data += chunk
            if len(self.data) > self.limits.max_reply_bytes:
                self.stop("output")

    def expire(self, now: float) -> None:
        """Stop a child still running past its wall-clock net (it is killed: `time`)."""
        if self.exit is None and self.stopped is None and now >= self.deadline:
            self.stop("time")

    def stop(self, why: str) -> None:
        """Kill the child and discard its reply; the refusal's resource is `why`."""
        self.stopped = why
        self.data = bytearray()
        self._close_reply()
        if self.exit is None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)

    def reaped(self, status: int, usage: resource.struct_rusage) -> None:
        self.exit = (status, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024)

    def lost(self) -> None:
        """The child is gone without a wait status (reaped elsewhere): a crash."""
        if self.stopped is None:
            self.stopped = "crashed"
        self._close_reply()
        self.exit = (0, 0.0, 0)

    def close(self) -> None:
        """Release the fds (idempotent); a child still running dies by its lifeline."""
        self._close_reply()
        if self.lifeline_fd >= 0:
            os.close(self.lifeline_fd)
            self.lifeline_fd = -1

    def _close_reply(self) -> None:
        if self.reply_fd >= 0:
            os.close(self.reply_fd)
            self.reply_fd = -1

    def outcome(self) -> CompiledBundle:
        """The compiled bundle, or the coded refusal raised; only once `done`."""
        assert self.exit is not None
        status, cpu_seconds, peak_rss = self.exit
        # Peak resident memory past half the budget: a MemoryError (or a death) came from
        # the address-space limit, not from the parser's own stack, which fails nested
        # source early.
        near_limit = peak_rss >= self.base_rss + self.limits.memory_bytes // 2
        if self.stopped is not None:
            raise too_complex_to_compile(self.stopped)
        if os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0:
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
            if sig == signal.SIGXCPU or cpu_seconds >= self.limits.cpu_seconds:
                raise too_complex_to_compile("cpu")
            if near_limit:
                raise too_complex_to_compile("memory")
            raise too_complex_to_compile("crashed", status=status)
        return parse_reply(bytes(self.data), self.bundle, near_memory_limit=near_limit)


def depends_on_source_alone(err: SuaveplanError) -> bool:
    """Whether a refusal is the checker's verdict on the source, the same at every later
    load of that bundle (a forbidden import or syntax, a dunder attribute), and so worth
    remembering by digest. `too-complex-to-compile` is not: it depends on the load's memory
    limit, on CPU time and wall-clock time that vary with the machine's speed and load, or
    on a child that died, perhaps by the OOM killer's hand; a later load may well pass."""
    return err.details.get("reason") != _TOO_COMPLEX


def _own_memory() -> tuple[int, int]:
    """This process's address space and resident size, in bytes."""
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        size, rss = Path("/proc/self/statm").read_bytes().split()[:2]
        return int(size) * page, int(rss) * page
    except (OSError, ValueError):
        return 256 * 1024 * 1024, 64 * 1024 * 1024


def parse_reply(
    data: bytes, bundle: PluginBundle, *, near_memory_limit: bool = False
) -> CompiledBundle:
    """The compiled bundle in a compile child's reply, or its coded refusal raised.

    A frame of any other shape, over `MAX_REPLY_BYTES`, naming other modules than `bundle`'s
    (in its order) or holding anything but code objects of their file names is refused as
    `too-complex-to-compile` (`resource` `crashed`): the child did not do its job."""
    bad = too_complex_to_compile("crashed", why="bad-reply")
    if not isinstance(data, bytes) or len(data) > MAX_REPLY_BYTES:
        raise bad
    try:
        frame = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_ext_len=0,
            max_bin_len=MAX_REPLY_BYTES,
            max_str_len=MAX_REPLY_BYTES,
        )
    except Exception:  # msgpack raises many types; all mean "malformed"
        raise bad from None
    if type(frame) is not dict:
        raise bad
    if set(frame) <= {"error", "memory"} and "error" in frame:
        memory = frame.get("memory", False)
        if type(memory) is not bool:
            raise bad
        err = SuaveplanError.from_wire(frame["error"])
        if err.code not in REFUSAL_CODES:
            raise bad
        if memory and near_memory_limit:
            file = err.details.get("file")
            raise too_complex_to_compile("memory", **({"file": file} if type(file) is str else {}))
        raise err
    mods = frame.get("modules")
    if set(frame) != {"modules"} or type(mods) is not list or len(mods) != len(bundle.modules):
        raise bad
    out: dict[str, CompiledModule] = {}
    for m, entry in zip(bundle.modules, mods, strict=True):
        if type(entry) is not list or len(entry) != 2 or entry[0] != m.name:
            raise bad
        blob = entry[1]
        if type(blob) is not bytes:
            raise bad
        # SECURITY: `marshal` is not safe against data an adversary made, and this is the
        # one place the fork server turns a child's bytes into objects. It is trusted
        # because its only producer is the child forked above from this very process: that
        # child ran our parser, checker and compiler on the plugin's source and
        # `marshal.dumps` on the result, and never ran, imported or unpickled anything the
        # plugin wrote (no plugin code runs before a worker starts). A plugin controls the
        # *input* of CPython's compiler, not the bytes of its output; what remains is a
        # memory-safety bug in the parser or compiler, which would have struck the host or
        # the fork server itself before this child existed, and even then the child holds
        # nothing but this pipe (worker hardening: no files, no sockets, no exec). The frame
        # is bounded and shaped above, and every object loaded must be a code object of the
        # module's own file name, else the whole reply is refused.
        try:
            code = marshal.loads(blob)  # noqa: S302 - see SECURITY above
        except (EOFError, ValueError, TypeError):
            raise bad from None
        if type(code) is not types.CodeType or code.co_filename != m.filename:
            raise bad
        out[m.name] = CompiledModule(m.name, m.filename, m.is_package, code)
    return CompiledBundle.of(bundle, out)


def refusal_wire(err: SuaveplanError) -> dict[str, object]:
    """A refusal as the fork server sends it to the host: no cause, and small enough for one
    control message (details too large are cut to the reason)."""
    wire: dict[str, object] = {"code": err.code, "message": err.message[:256]}
    wire["details"] = err.to_wire()["details"]
    if len(msgpack.packb(wire, use_bin_type=True)) > _MAX_REFUSAL_BYTES:
        reason = err.details.get("reason")
        wire["details"] = {"reason": reason[:64] if isinstance(reason, str) else "details-cut"}
    return wire


def _child(  # noqa: PLR0917
    bundle: PluginBundle,
    w: int,
    lifeline: int,
    limits: CompileLimits,
    base_vm: int,
    plan: HardeningPlan | None,
    close: tuple[int, ...],
) -> NoReturn:
    """The compile child's whole life; it never returns into the fork server's loop."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        # Dies with the fork server (and so with the host), busy or not: the CPU limit
        # alone would let a spinning child outlive both by half a minute.
        arm_lifeline(lifeline)
        memory = base_vm + limits.memory_bytes
        cpu = int(time.process_time()) + 1 + limits.cpu_seconds
        _limit(memory, cpu)  # first, so that nothing below runs unlimited
        if plan is not None:
            # Defence in depth against a parser bug: the child keeps only its reply pipe
            # (and its lifeline).
            # Nothing of the plugin's runs here, so a layer that fails is no reason to stop.
            with contextlib.suppress(Exception):
                apply_hardening(
                    plan,
                    keep_fds=(w, lifeline),
                    rlimits=RlimitSettings(address_space_bytes=memory, cpu_seconds=None),
                )
            _limit(memory, cpu)  # again: hardening sets RLIMIT_CPU its own way
        warnings.simplefilter("ignore")  # no stderr to show them on, nor file to read
        frame = _compile_frame(bundle)
        data = memoryview(msgpack.packb(frame, use_bin_type=True))
        while data:
            data = data[os.write(w, data) :]
    except BaseException:
        os._exit(_EXIT_FAILED)
    os._exit(0)


def _limit(memory: int, cpu: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _compile_frame(bundle: PluginBundle) -> dict[str, object]:
    try:
        compiled = compile_bundle(bundle)
        return {"modules": [[m.name, marshal.dumps(m.code)] for m in compiled.modules.values()]}
    except SuaveplanError as exc:
        # The loader turns the parser's MemoryError into `too-deeply-nested`; whether it was
        # the address-space limit instead is the fork server's call (it sees the peak).
        memory = isinstance(exc.__context__, MemoryError)
        return {"error": refusal_wire(exc), "memory": memory}
    except MemoryError:
        return {"error": refusal_wire(too_complex_to_compile("memory")), "memory": True}
    except Exception as exc:  # the checker failing on input it should refuse: fail closed
        err = SuaveplanError(_SYNTAX, "plugin source cannot be checked", {"reason": "uncheckable"})
        err.details["type"] = type(exc).__name__
        return {"error": refusal_wire(err)}
