"""`fs.list_dir` filtering: off the event loop when long, the same names wherever it runs,
and a listing bounded before any filtering.

The gateway shows a plugin only the entries its rules let it read. Under per-name rules that
costs ~2 us a name: 100,000 names would hold the host's loop, which every sandbox shares,
for 100-200 ms. A listing longer than `_INLINE_LIST_ENTRIES` is therefore filtered on a
worker thread, by the same function, so the names cannot differ. The proofs here are about
order, never time: a filter whose first step waits for the loop to run another task can only
finish if it is off the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suaveplan_sandbox.adapters import Adapters, BeneathRootFs
from suaveplan_sandbox.adapters._fs import DEFAULT_MAX_LIST_ENTRIES
from suaveplan_sandbox.adapters._ready import Ready
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.gateway import Gateway, _gateway
from suaveplan_sandbox.metrics import CAPABILITY_CALLS, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy, _accel
from suaveplan_sandbox.permissions._decision import Allow
from suaveplan_sandbox.permissions._fs_rules import FsRuleSet

_SAFETY_NET = 30.0  # seconds a gated filter waits before giving up (only ever on failure)


class _Names:
    """An fs adapter whose every listing is `names`, in three shapes: a plain `def`, a
    coroutine and a `Ready` (the shapes `Adapters` accepts)."""

    def __init__(self, names: Iterable[object], shape: str = "sync") -> None:
        self.names = names
        self.shape = shape

    def list_dir(self, path: str) -> object:
        if self.shape == "sync":
            return self.names
        if self.shape == "ready":
            return Ready(self.names)

        async def answer() -> object:
            return self.names

        return answer()

    def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        raise AssertionError("only listings here")

    def write_bytes(self, path: str, data: bytes) -> None:
        raise AssertionError("only listings here")

    def exists(self, path: str) -> bool:
        raise AssertionError("only listings here")


def _gateway_for(rules: list[str], fs: object) -> tuple[Gateway, InMemoryMetrics]:
    metrics = InMemoryMetrics()
    policy = PermissionPolicy.from_manifest(
        {"name": "lister", "permissions": {"fs": rules}}, root="/srv"
    )
    checker = PermissionChecker(policy, metrics=metrics)
    return Gateway(checker=checker, adapters=Adapters(fs=fs)), metrics  # type: ignore[arg-type]


def _plain_filter(rules: list[str], directory: str, names: Iterable[object]) -> list[str]:
    """The listing by definition: every plain entry name whose path `check` allows reading."""
    with _accel.pure_python():
        reference = FsRuleSet(rules)
    prefix = "" if directory == "." else directory + "/"
    return sorted(
        name
        for name in names
        if type(name) is str
        and name not in ("", ".", "..")
        and "/" not in name
        and isinstance(reference.check(prefix + name, "read"), Allow)
    )


async def _eager(gateway: Gateway, path: str) -> object:
    done, value = gateway.dispatch_eager("fs", "list_dir", {"path": path})
    if done:
        return value
    assert isinstance(value, asyncio.Task)
    return await value


# -- the same names, inline or off the loop --------------------------------------------------

_SEGMENTS = st.sampled_from(["d", "sub", "a", "ab", "*", "a*", "*.csv", "x.csv", "é", "*b"])
_RULES = st.lists(
    st.builds(lambda segs: "./" + "/".join(segs), st.lists(_SEGMENTS, min_size=1, max_size=3)),
    max_size=4,
)
_NAMES = st.lists(
    st.one_of(
        st.sampled_from(
            [
                *("a", "ab", "b", "a.csv", "x.csv", "é.csv", "sub", "*", ".env", ".", "..", ""),
                *("a/b", "a\x00", "\ud800.csv", "x" * 256, "a" * 255),
            ]
        ),
        st.text(alphabet="ab.*/é\x00", max_size=6),
        st.integers(0, 3),
    ),
    max_size=40,
)
_DIRECTORIES = st.sampled_from([(".", "./"), ("d", "./d"), ("d/sub", "./d/sub")])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rules=_RULES,
    names=_NAMES,
    directory=_DIRECTORIES,
    inline_up_to=st.sampled_from([0, 3, 1024]),
    shape=st.sampled_from(["sync", "async", "ready"]),
)
def test_every_entry_point_lists_what_the_plain_filter_lists(
    rules: list[str],
    names: list[object],
    directory: tuple[str, str],
    inline_up_to: int,
    shape: str,
) -> None:
    path, grant = directory
    all_rules = [grant, *rules]  # listing needs read access to the directory itself
    try:
        gateway, _ = _gateway_for(all_rules, _Names(names, shape))
    except SuaveplanError:
        return  # a rule the manifest refuses: nothing to list with
    want = _plain_filter(all_rules, path, names)

    async def listings() -> list[object]:
        return [
            await gateway.dispatch("fs", "list_dir", {"path": path}),
            await _eager(gateway, path),
        ]

    with mock.patch.object(_gateway, "_INLINE_LIST_ENTRIES", inline_up_to):
        got = asyncio.run(listings())
        if shape != "async":  # dispatch_sync reaches a coroutine adapter only through a loop
            got.append(gateway.dispatch_sync("fs", "list_dir", {"path": path}))
    assert all(listing == want for listing in got), (got, want)


async def test_a_real_directory_lists_the_same_names_inline_and_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [f"f{i:04}.{'csv' if i % 3 else 'txt'}" for i in range(1500)] + [".env", "sub"]
    for name in names:
        (tmp_path / "data" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "data" / name).touch()
    rules = ["./data", "./data/*.csv", "./data/.env", "./data/f00*"]
    fs = BeneathRootFs(tmp_path)
    try:
        gateway, _ = _gateway_for(rules, fs)
        off_loop = await gateway.dispatch("fs", "list_dir", {"path": "data"})
        monkeypatch.setattr(_gateway, "_INLINE_LIST_ENTRIES", 1_000_000)
        inline = await gateway.dispatch("fs", "list_dir", {"path": "data"})
    finally:
        fs.close()
    assert off_loop == inline == _plain_filter(rules, "data", names)
    assert isinstance(off_loop, list)
    assert 1000 < len(off_loop) < len(names)


# -- off the loop ----------------------------------------------------------------------------


class _GatedNames(list[str]):
    """Names whose iteration first waits for `gate`. The filter iterates them; if it did so
    on the loop's thread, the loop could never run the task that opens the gate."""

    def __init__(self, names: Iterable[str]) -> None:
        super().__init__(names)
        self.started = threading.Event()
        self.gate = threading.Event()
        self.opened: bool | None = None
        self.threads: list[int] = []

    def __iter__(self) -> Iterator[str]:
        self.threads.append(threading.get_ident())
        self.started.set()
        self.opened = self.gate.wait(_SAFETY_NET)
        return super().__iter__()


async def _open_gate_from_the_loop(names: _GatedNames, order: list[str]) -> int:
    """Wait, turn by turn, for the filter to start, then open its gate: the loop's turns."""
    turns = 0
    while not names.started.is_set():
        turns += 1
        await asyncio.sleep(0)
    order.append("ping")
    names.gate.set()
    return turns


_ENTRY_POINTS: list[tuple[str, str]] = [
    ("dispatch", "sync"),
    ("dispatch", "async"),
    ("dispatch", "ready"),
    ("eager", "sync"),
    ("eager", "async"),
    ("eager", "ready"),
]


@pytest.mark.parametrize(("entry", "shape"), _ENTRY_POINTS)
async def test_a_long_listing_is_filtered_while_the_loop_runs_other_tasks(
    entry: str, shape: str
) -> None:
    names = _GatedNames(f"f{i:05}.csv" for i in range(5000))
    gateway, metrics = _gateway_for(["./d", "./d/*.csv", "./d/f0*"], _Names(names, shape))
    order: list[str] = []

    async def listing() -> object:
        if entry == "dispatch":
            result = await gateway.dispatch("fs", "list_dir", {"path": "d"})
        else:
            result = await _eager(gateway, "d")
        order.append("listing")
        return result

    listed = asyncio.create_task(listing())
    ping = asyncio.create_task(_open_gate_from_the_loop(names, order))
    result = await listed
    await ping
    # The loop ran the ping while the filter waited for it: the filter was off the loop.
    assert names.opened is True
    assert order == ["ping", "listing"]
    assert names.threads != [threading.get_ident()]
    assert result == sorted(names)
    assert metrics.value(CAPABILITY_CALLS.name, outcome="ok") == 1


async def test_a_short_listing_is_filtered_inline_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Small listings are the common ones, and a thread hop would cost more than the filter.
    threads: list[int] = []
    readable_entries = FsRuleSet.readable_entries

    def recording(self: FsRuleSet, directory: str, names: Iterable[object]) -> list[str]:
        threads.append(threading.get_ident())
        return readable_entries(self, directory, names)

    monkeypatch.setattr(FsRuleSet, "readable_entries", recording)
    short = [f"f{i}.csv" for i in range(_gateway._INLINE_LIST_ENTRIES)]
    long = [*short, "one-more.csv"]
    for names in (short, long):
        gateway, _ = _gateway_for(["./d/*"], _Names(names))
        assert await gateway.dispatch("fs", "list_dir", {"path": "d"}) == sorted(names)
        done, value = gateway.dispatch_eager("fs", "list_dir", {"path": "d"})
        assert done is (names is short)  # inline: answered without a task
        if not done:
            assert isinstance(value, asyncio.Task)
            value = await value
        assert value == sorted(names)
    loop_thread = threading.get_ident()
    assert threads[:2] == [loop_thread, loop_thread]
    assert loop_thread not in threads[2:]
    assert len(threads) == 4


def test_dispatch_sync_filters_a_long_listing_on_its_own_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The WASM guest thread may block: no hop to another thread for it.
    threads: list[int] = []
    readable_entries = FsRuleSet.readable_entries

    def recording(self: FsRuleSet, directory: str, names: Iterable[object]) -> list[str]:
        threads.append(threading.get_ident())
        return readable_entries(self, directory, names)

    monkeypatch.setattr(FsRuleSet, "readable_entries", recording)
    names = [f"f{i}.csv" for i in range(5000)]
    gateway, _ = _gateway_for(["./d/*"], _Names(names))
    assert gateway.dispatch_sync("fs", "list_dir", {"path": "d"}) == sorted(names)
    assert threads == [threading.get_ident()]


@pytest.mark.parametrize("entry", ["dispatch", "eager"])
async def test_closing_the_gateway_cancels_a_listing_being_filtered_off_the_loop(
    entry: str,
) -> None:
    names = _GatedNames(f"f{i:05}" for i in range(5000))
    gateway, _ = _gateway_for(["./d/*"], _Names(names))
    if entry == "dispatch":
        listed: asyncio.Future[object] = asyncio.ensure_future(
            gateway.dispatch("fs", "list_dir", {"path": "d"})
        )
    else:
        done, task = gateway.dispatch_eager("fs", "list_dir", {"path": "d"})
        assert not done
        assert isinstance(task, asyncio.Task)
        listed = task
    while not names.started.is_set():
        await asyncio.sleep(0)
    await gateway.close()
    names.gate.set()  # the worker thread finishes; its names go nowhere
    with pytest.raises(SuaveplanError) as info:
        await listed
    assert info.value.code == "SAND_CANCELLED"


class _Exploding(list[str]):
    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("an adapter's odd list")


@pytest.mark.parametrize("inline_up_to", [0, 1_000_000])
@pytest.mark.parametrize("entry", ["dispatch", "eager", "sync"])
async def test_a_filter_failure_is_the_same_coded_error_inline_or_off_the_loop(
    inline_up_to: int, entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_gateway, "_INLINE_LIST_ENTRIES", inline_up_to)
    gateway, metrics = _gateway_for(["./d/*"], _Names(_Exploding(["a", "b"])))
    call: Callable[[], Any] = {
        "dispatch": lambda: gateway.dispatch("fs", "list_dir", {"path": "d"}),
        "eager": lambda: _eager(gateway, "d"),
        "sync": lambda: asyncio.to_thread(gateway.dispatch_sync, "fs", "list_dir", {"path": "d"}),
    }[entry]
    with pytest.raises(SuaveplanError) as info:
        await call()
    assert info.value.code == "SAND_ADAPTER_FAILED"
    assert metrics.value(CAPABILITY_CALLS.name, outcome="error") == 1


# -- the bound -------------------------------------------------------------------------------


def test_the_fs_adapter_bounds_a_listing_by_default() -> None:
    assert DEFAULT_MAX_LIST_ENTRIES == 100_000
    default = inspect.signature(BeneathRootFs).parameters["max_list_entries"].default
    assert default == DEFAULT_MAX_LIST_ENTRIES


async def test_a_plugin_listing_a_directory_past_the_bound_gets_a_coded_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The adapter stops reading at `max_list_entries` names, before any is filtered: the
    # host never holds a huge directory's names, and the plugin gets SAND_FS_TOO_LARGE.
    filtered: list[object] = []
    readable_entries = FsRuleSet.readable_entries

    def recording(self: FsRuleSet, directory: str, names: Iterable[object]) -> list[str]:
        filtered.append(names)
        return readable_entries(self, directory, names)

    monkeypatch.setattr(FsRuleSet, "readable_entries", recording)
    (tmp_path / "big").mkdir()
    for i in range(51):
        (tmp_path / "big" / f"f{i:02}.csv").touch()
    fs = BeneathRootFs(tmp_path, max_list_entries=50)
    try:
        gateway, metrics = _gateway_for(["./big", "./big/f1*"], fs)
        calls: list[Callable[[], Any]] = [
            lambda: gateway.dispatch("fs", "list_dir", {"path": "big"}),
            lambda: _eager(gateway, "big"),
        ]
        for call in calls:
            with pytest.raises(SuaveplanError) as info:
                await call()
            assert info.value.code == "SAND_FS_TOO_LARGE"
        (tmp_path / "big" / "f00.csv").unlink()  # 50 entries: at the bound, listed
        assert await gateway.dispatch("fs", "list_dir", {"path": "big"}) == [
            f"f{i}.csv" for i in range(10, 20)
        ]
    finally:
        fs.close()
    assert len(filtered) == 1  # only the listing within the bound reached the filter
    assert metrics.value(CAPABILITY_CALLS.name, outcome="error") == 2
