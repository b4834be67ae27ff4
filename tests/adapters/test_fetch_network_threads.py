"""The fetch adapter's lookups and dials run on its own few threads, never the loop's.

A plugin granted a name in a DNS zone it controls can make every lookup hang for the
resolver's timeout. On the loop's default executor (the one `asyncio.to_thread` and the
filesystem adapter's hops use) enough hung lookups would leave no thread for anything else.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from suaveplan_sandbox.adapters import _fetch
from suaveplan_sandbox.adapters._fetch import DEFAULT_NETWORK_THREADS, HttpxFetch
from suaveplan_sandbox.errors import SuaveplanError

# More hung lookups than the default executor has threads (min(32, cpus + 4)).
LOOKUPS = 40


class _HungResolver:
    """Stands in for `getaddrinfo` against a zone that does not answer until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.threads: set[str] = set()

    def __call__(self, host: str, port: int) -> list[str]:
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.threads.add(threading.current_thread().name)
        try:
            self.release.wait(30)
            return ["93.184.216.34"]
        finally:
            with self._lock:
                self.running -= 1


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the condition never held")


@pytest.fixture
def hung(monkeypatch: pytest.MonkeyPatch) -> _HungResolver:
    resolver = _HungResolver()
    monkeypatch.setattr(_fetch, "_lookup", resolver)
    return resolver


async def test_hung_lookups_hold_only_the_adapters_threads(hung: _HungResolver) -> None:
    fetch = HttpxFetch(network_threads=2)
    lookups = [
        asyncio.create_task(fetch.vet(f"h{i}.example", 443, "example")) for i in range(LOOKUPS)
    ]
    await _until(lambda: hung.running == 2)
    # The default executor still has every thread: a filesystem-style hop runs at once.
    assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 10) == "free"
    assert hung.running == 2
    hung.release.set()
    answers = await asyncio.gather(*lookups)
    assert answers == [["93.184.216.34"]] * LOOKUPS
    assert hung.peak == 2
    assert all(name.startswith("suaveplan-fetch-net") for name in hung.threads)
    await fetch.aclose()


async def test_the_default_is_a_few_threads(hung: _HungResolver) -> None:
    fetch = HttpxFetch()
    lookups = [
        asyncio.create_task(fetch.vet(f"h{i}.example", 443, "example")) for i in range(LOOKUPS)
    ]
    await _until(lambda: hung.running == DEFAULT_NETWORK_THREADS)
    await asyncio.wait_for(asyncio.to_thread(lambda: None), 10)
    hung.release.set()
    await asyncio.gather(*lookups)
    assert hung.peak == DEFAULT_NETWORK_THREADS < 32
    await fetch.aclose()


async def test_closing_drops_queued_lookups_with_a_coded_error(hung: _HungResolver) -> None:
    fetch = HttpxFetch(network_threads=1)
    first = asyncio.create_task(fetch.vet("a.example", 443, "example"))
    queued = asyncio.create_task(fetch.vet("b.example", 443, "example"))
    await _until(lambda: hung.running == 1)
    await fetch.aclose()  # returns although a lookup is still hung
    with pytest.raises(SuaveplanError) as info:
        await queued
    assert info.value.code == "SAND_FETCH_FAILED"
    assert not queued.cancelled()
    with pytest.raises(SuaveplanError) as info:
        await fetch.vet("c.example", 443, "example")
    assert info.value.code == "SAND_FETCH_FAILED"
    hung.release.set()
    assert await first == ["93.184.216.34"]  # the thread's answer still lands


async def test_cancelling_the_caller_is_still_a_cancellation(hung: _HungResolver) -> None:
    fetch = HttpxFetch(network_threads=1)
    lookup = asyncio.create_task(fetch.vet("a.example", 443, "example"))
    await _until(lambda: hung.running == 1)
    lookup.cancel()
    with pytest.raises(asyncio.CancelledError):
        await lookup
    hung.release.set()
    await fetch.aclose()


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "4"])
def test_network_threads_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(SuaveplanError) as info:
        HttpxFetch(network_threads=bad)  # type: ignore[arg-type]
    assert info.value.code == "SAND_INVALID_ARGUMENT"
