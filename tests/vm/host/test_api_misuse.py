"""A careless or hostile *caller* of the VM host API gets a coded error and leaves nothing.

`create_vm_sandbox` is given wrong types and odd values for each argument: every one is
`SAND_INVALID_ARGUMENT` naming the argument, refused before the plugin is read or a worker
forked, so no fd, process or thread is left. A create that fails part-way (a forbidden
import, a subscription the manifest does not grant, a bus that fails, a worker that dies while
starting) returns the host to its baseline, event-bus subscriptions included.

A handle dropped without `dispose()` is released by its finalizer: the worker, its lifeline
and socket, and (for the blocking facade) its loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

import psutil
import pytest

from _create_argument_cases import COMMON_BAD_ARGUMENTS, VM_IGNORED_COMBINATIONS, bad_paths
from suaveplan_sandbox.adapters import Adapters, InProcessEventBus
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import _sandbox, create_vm_sandbox, create_vm_sandbox_sync
from suaveplan_sandbox.vm._zygote import fork_server

PLUGIN = """\
def echo(*args, **kwargs):
    return [list(args), kwargs]


def _private():
    return 1
"""


def _plugin(tmp: Path, source: str = PLUGIN, name: str = "plugin.py") -> Path:
    path = tmp / name
    path.write_text(source)
    return path


def _policy(tmp: Path, **manifest: Any) -> PermissionPolicy:
    return PermissionPolicy.from_manifest({"name": "misuse", **manifest}, root=tmp)


def _resources() -> tuple[int, int, int]:
    """Open fds, live descendants and threads (not the default executor's reused pool)."""
    gc.collect()
    fork_server().ping()  # collects the fork server's exit notices
    live = 0
    for child in psutil.Process().children(recursive=True):
        try:
            live += child.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            continue
    threads = sum(1 for t in threading.enumerate() if not t.name.startswith("asyncio_"))
    return len(os.listdir("/proc/self/fd")), live, threads


async def _settled(baseline: tuple[int, int, int], timeout_s: float = 5.0) -> tuple[int, int, int]:
    """The resources once they are back at `baseline`, or as they are after the timeout."""
    deadline = time.monotonic() + timeout_s
    now = _resources()
    while now != baseline and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        now = _resources()
    return now


async def _warm(tmp: Path) -> tuple[int, int, int]:
    """Start what is started once per process (the fork server), then take the baseline."""
    sb = await create_vm_sandbox(
        plugin_module_path=_plugin(tmp, name="warm.py"), policy=_policy(tmp)
    )
    await sb.dispose()
    return await _settled(_resources(), 0.2)


# (argument, value): every one is refused with SAND_INVALID_ARGUMENT naming the argument.
BAD_ARGUMENTS: list[tuple[str, object]] = [
    *bad_paths("plugin_module_path", optional=False),
    *COMMON_BAD_ARGUMENTS,
    ("require_hardening", None),
    ("require_hardening", "seccomp"),  # a str is not taken apart into one-letter layers
    ("require_hardening", [5]),
    ("require_hardening", {"seccomp": True}),
    ("require_hardening", ["sekcomp"]),
    *bad_paths("data_dir", optional=True),
]


@pytest.mark.parametrize(
    ("argument", "value"),
    BAD_ARGUMENTS,
    ids=[f"{a}-{i}" for i, (a, _v) in enumerate(BAD_ARGUMENTS)],
)
async def test_a_create_argument_it_cannot_use_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argument: str, value: object
) -> None:
    baseline = await _warm(tmp_path)
    kwargs: dict[str, Any] = {
        "plugin_module_path": _plugin(tmp_path),
        "policy": _policy(tmp_path),
        argument: value,
    }

    def never(*_a: object, **_k: object) -> None:
        raise AssertionError("the plugin was read before the arguments were checked")

    monkeypatch.setattr(_sandbox, "load_plugin", never)
    with pytest.raises(SuaveplanError) as info:
        await create_vm_sandbox(**kwargs)
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details["argument"] == argument
    assert await _settled(baseline) == baseline


@pytest.mark.parametrize(
    ("argument", "combination"),
    VM_IGNORED_COMBINATIONS,
    ids=[f"{a}-{i}" for i, (a, _c) in enumerate(VM_IGNORED_COMBINATIONS)],
)
async def test_an_argument_proxies_would_make_it_ignore_is_refused_before_anything_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argument: str,
    combination: dict[str, Any],
) -> None:
    # `data_dir=` says where the default adapter set keeps SQLite; with `proxies=` there is
    # no default set, and the host's data_dir used to be dropped without a word.
    (tmp_path / "data").mkdir()
    policy = _policy(
        tmp_path, database={"tablePrefix": "misuse_"}, permissions={"fs": ["./data/*"]}
    )
    baseline = await _warm(tmp_path)

    def never(*_a: object, **_k: object) -> None:
        raise AssertionError("something started before the arguments were checked")

    monkeypatch.setattr(_sandbox, "load_plugin", never)
    monkeypatch.setattr(_sandbox, "open_standard_adapters", never)
    monkeypatch.setattr(_sandbox, "fork_server", never)
    with pytest.raises(SuaveplanError) as info:
        await create_vm_sandbox(plugin_module_path=_plugin(tmp_path), policy=policy, **combination)
    assert info.value.code == "SAND_INVALID_ARGUMENT"
    assert info.value.details["argument"] == argument
    assert info.value.details["reason"] == "ignored-with-proxies"
    assert await _settled(baseline) == baseline


def test_the_blocking_facade_refuses_an_ignored_combination_too(tmp_path: Path) -> None:
    with pytest.raises(SuaveplanError) as info:
        create_vm_sandbox_sync(
            plugin_module_path=_plugin(tmp_path),
            policy=_policy(tmp_path),
            proxies=Adapters(),
            data_dir=tmp_path,
        )
    assert info.value.details["argument"] == "data_dir"


def test_the_blocking_facade_refuses_a_bad_argument_and_stops_its_loop_thread(
    tmp_path: Path,
) -> None:
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(SuaveplanError) as info:
        create_vm_sandbox_sync(plugin_module_path=5, policy=_policy(tmp_path))
    assert info.value.details["argument"] == "plugin_module_path"
    assert {t.name for t in threading.enumerate()} <= before


def test_the_layers_a_host_may_require_are_still_accepted(tmp_path: Path) -> None:
    with create_vm_sandbox_sync(
        plugin_module_path=_plugin(tmp_path),
        policy=_policy(tmp_path),
        plugin_name="misuse-2.x",
        require_hardening=["fds", "env"],
    ) as sb:
        assert sb.call("echo", 1) == [[1], {}]


# -- a create that fails part-way --------------------------------------------------------

SUBSCRIBER = """\
from suaveplan import events


@events.subscribe("granted.topic")
def first(topic, payload):
    pass


@events.subscribe("{second}")
def second(topic, payload):
    pass


def f():
    return 1
"""


class _BusFailingSecondSubscribe:
    """A bus whose backend fails on the second subscription of a creation."""

    def __init__(self) -> None:
        self.inner = InProcessEventBus()
        self.calls = 0

    async def publish(self, plugin: str, topic: str, payload: WireValue) -> None:
        await self.inner.publish(plugin, topic, payload)

    async def subscribe(self, plugin: str, pattern: str, handler: Any) -> Any:
        self.calls += 1
        if self.calls == 2:
            raise ConnectionError("backend went away")
        return await self.inner.subscribe(plugin, pattern, handler)


@pytest.mark.parametrize(
    ("case", "source", "manifest", "code"),
    [
        (
            "forbidden-import",
            "import os\n\ndef f():\n    return 1\n",
            {},
            "SAND_VM_MODULE_IMPORT_FORBIDDEN",
        ),
        (
            "subscription-not-granted",
            SUBSCRIBER.format(second="secret.topic"),
            {"events": {"subscribes": ["granted.*"]}},
            "SAND_PERM_DENIED",
        ),
        (
            "bus-fails-on-the-second-subscription",
            SUBSCRIBER.format(second="granted.other"),
            {"events": {"subscribes": ["granted.*"]}},
            "SAND_ADAPTER_FAILED",
        ),
        ("raises-at-import", "raise ValueError('no')\n", {}, "SAND_VM_PLUGIN_ERROR"),
        (
            "dies-while-starting",
            "while True:\n    pass\n",
            {"permissions": {"budgets": {"wallClockMs": 200}}},
            None,  # the worker is ended while starting; which code says so is not pinned
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and "\n" not in v and v.islower() else "",
)
async def test_a_create_that_fails_part_way_leaves_no_fd_process_thread_or_subscription(
    tmp_path: Path, case: str, source: str, manifest: dict[str, Any], code: str | None
) -> None:
    baseline = await _warm(tmp_path)
    failing = _BusFailingSecondSubscribe()
    bus = failing.inner if "bus" in case else InProcessEventBus()
    with pytest.raises(SuaveplanError) as info:
        await asyncio.wait_for(
            create_vm_sandbox(
                plugin_module_path=_plugin(tmp_path, source),
                policy=_policy(tmp_path, **manifest),
                proxies=Adapters(events=failing if "bus" in case else bus),
            ),
            60,
        )
    if code is not None:
        assert info.value.code == code
    if "bus" in case:
        assert failing.calls == 2  # the first subscription was made before the failure
    assert bus._subs == set()  # the subscriptions made before the failure went with it
    assert await _settled(baseline) == baseline


# -- calls a careless host makes ---------------------------------------------------------


async def test_names_that_are_not_public_functions_are_refused_and_the_sandbox_carries_on(
    tmp_path: Path,
) -> None:
    async with await create_vm_sandbox(
        plugin_module_path=_plugin(tmp_path), policy=_policy(tmp_path)
    ) as sb:
        for name in ("__init__", "_private", "__builtins__", "__name__", "nope", "echo "):
            with pytest.raises(SuaveplanError) as info:
                await sb.call(name)
            assert info.value.code == "SAND_VM_NO_SUCH_FUNCTION", name
        assert await sb.call("echo", 1) == [[1], {}]


async def test_plain_data_arguments_of_every_kind_reach_the_plugin(tmp_path: Path) -> None:
    async with await create_vm_sandbox(
        plugin_module_path=_plugin(tmp_path), policy=_policy(tmp_path)
    ) as sb:
        big = "x" * (10 * 1024 * 1024)
        assert await sb.call("echo", big) == [[big], {}]
        assert await sb.call("echo", (1, 2), b"ab", None, __class__=1) == [
            [[1, 2], b"ab", None],
            {"__class__": 1},
        ]


async def test_a_dict_argument_with_a_non_str_key_is_refused_and_the_sandbox_survives(
    tmp_path: Path,
) -> None:
    async with await create_vm_sandbox(
        plugin_module_path=_plugin(tmp_path), policy=_policy(tmp_path)
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("echo", {1: "one"})
        assert info.value.code == "SAND_INVALID_ARGUMENT"
        assert await sb.call("echo", 1) == [[1], {}]


@pytest.mark.parametrize(
    "value", [{1, 2}, 2**70, object(), "\ud800"], ids=["set", "bigint", "obj", "surrogate"]
)
async def test_an_argument_that_is_not_plain_data_is_an_invalid_argument(
    tmp_path: Path, value: object
) -> None:
    async with await create_vm_sandbox(
        plugin_module_path=_plugin(tmp_path), policy=_policy(tmp_path)
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call("echo", value)
        assert info.value.code == "SAND_INVALID_ARGUMENT"


@pytest.mark.parametrize("name", ["", 5, None, b"echo", "x" * 300])
async def test_a_call_name_that_is_not_a_str_name_is_an_invalid_argument(
    tmp_path: Path, name: Any
) -> None:
    async with await create_vm_sandbox(
        plugin_module_path=_plugin(tmp_path), policy=_policy(tmp_path)
    ) as sb:
        with pytest.raises(SuaveplanError) as info:
            await sb.call(name)
        assert info.value.code == "SAND_INVALID_ARGUMENT"


async def test_a_plugin_keyword_named_like_the_call_parameters_reaches_the_plugin(
    tmp_path: Path,
) -> None:
    async with await create_vm_sandbox(
        plugin_module_path=_plugin(tmp_path), policy=_policy(tmp_path)
    ) as sb:
        keywords: dict[str, Any] = {"name": "n", "self": "s"}
        assert await sb.call("echo", **keywords) == [[], keywords]


# -- a handle dropped without dispose ----------------------------------------------------


def test_a_sandbox_dropped_without_dispose_leaves_no_fd_or_worker(tmp_path: Path) -> None:
    async def drop() -> int:
        sb = await create_vm_sandbox(plugin_module_path=_plugin(tmp_path), policy=_policy(tmp_path))
        await sb.call("echo", 1)
        return sb.pid

    asyncio.run(drop())  # warm-up: the fork server and its socket stay
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # the socket's, reported above
        gc.collect()
    baseline = _resources()
    fds_before = set(os.listdir("/proc/self/fd"))
    try:
        pid = asyncio.run(drop())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        deadline = time.monotonic() + 5
        while _resources() != baseline and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert _resources() == baseline
    finally:
        _close_leaked_pipes(fds_before)  # so later tests start from a clean process


def _close_leaked_pipes(before: set[str]) -> None:
    for name in set(os.listdir("/proc/self/fd")) - before:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}").startswith("pipe:"):
                os.close(int(name))


def test_a_blocking_facade_dropped_without_dispose_ends_its_worker_and_thread(
    tmp_path: Path,
) -> None:
    with create_vm_sandbox_sync(plugin_module_path=_plugin(tmp_path), policy=_policy(tmp_path)):
        pass  # warm-up
    baseline = _resources()
    sb = create_vm_sandbox_sync(plugin_module_path=_plugin(tmp_path), policy=_policy(tmp_path))
    # Kept for clean-up only: neither keeps the facade itself alive.
    loop_thread, inner = sb._loop, weakref.ref(sb._sandbox)
    try:
        assert sb.call("echo", 1) == [[1], {}]
        del sb
        gc.collect()
        deadline = time.monotonic() + 5
        while _resources() != baseline and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _resources() == baseline
    finally:
        # A leaked loop thread would fail every later test that forks (tests/_forking.py).
        left = inner()
        if left is not None and left.state != "disposed":
            with contextlib.suppress(SuaveplanError):
                loop_thread.run(left.dispose())
        del left
        loop_thread.stop()
