"""`run_vm_sandbox_conformance`: the api-sandbox-vm scenarios against any VM sandbox factory.

A factory is `async make_sandbox(*, plugin_module_path, policy, proxies, metrics)` returning
a handle with `await call(name, *args)` and `await dispose()` (as `create_vm_sandbox`).
Works without pytest: each scenario raises `AssertionError` naming itself on failure.
`VM_SCENARIOS` lists `(name, fn)` so a test suite can run them as separate items.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Final

from suaveplan_sandbox.adapters import Adapters, EventHandler
from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing._fakes import FakeFetch, InMemoryFs

VmSandboxFactory = Callable[..., Awaitable[Any]]
Scenario = Callable[[VmSandboxFactory], Coroutine[Any, Any, None]]

_MANIFEST: Final = {
    "name": "conformance",
    "version": "1.0.0",
    "permissions": {"fs": ["./data/*"], "fetch": ["api.example.com"]},
}


async def _with(
    make: VmSandboxFactory,
    source: str,
    *,
    proxies: Adapters | None = None,
    metrics: InMemoryMetrics | None = None,
    manifest: dict[str, Any] | None = None,
) -> Any:
    root = Path(tempfile.mkdtemp(prefix="sp-vm-conf-"))
    plugin = root / "plugin.py"
    plugin.write_text(source)
    policy = PermissionPolicy.from_manifest(manifest or _MANIFEST, root=root)
    return await make(
        plugin_module_path=str(plugin),
        policy=policy,
        proxies=proxies or Adapters(),
        metrics=metrics or InMemoryMetrics(),
    )


async def _code_of(awaitable: Awaitable[object]) -> str | None:
    try:
        await awaitable
    except SuaveplanError as exc:
        return exc.code
    return None


async def process_global_is_unreachable(make: VmSandboxFactory) -> None:
    code: str | None
    try:
        sb = await _with(make, "def f():\n    return os.getcwd()\n")
    except SuaveplanError as exc:
        code = exc.code
    else:
        try:
            code = await _code_of(sb.call("f"))
        finally:
            await sb.dispose()
    assert code is not None and code.startswith("SAND_VM_"), code


async def builtins_are_frozen(make: VmSandboxFactory) -> None:
    sb = await _with(
        make,
        "import json\n\ndef f():\n    json.foo = 1\n\ndef g():\n    return hasattr(json, 'foo')\n",
    )
    try:
        code = await _code_of(sb.call("f"))
        assert code is not None and code.startswith("SAND_VM_"), code
        assert await sb.call("g") is False
    finally:
        await sb.dispose()


async def _code_of_create_or_call(make: VmSandboxFactory, source: str) -> str | None:
    """The error code of creating a sandbox for `source`, or else of calling its `f()`."""
    try:
        sb = await _with(make, source)
    except SuaveplanError as exc:
        return exc.code
    try:
        return await _code_of(sb.call("f"))
    finally:
        await sb.dispose()


async def direct_eval_is_rejected(make: VmSandboxFactory) -> None:
    code = await _code_of_create_or_call(make, "def f():\n    return eval('1 + 1')\n")
    assert code == "SAND_VM_EVAL_REJECTED", code


async def indirect_eval_is_rejected(make: VmSandboxFactory) -> None:
    source = "def f():\n    e = (0, eval)[1]\n    return e('1 + 1')\n"
    code = await _code_of_create_or_call(make, source)
    assert code == "SAND_VM_INDIRECT_EVAL_REJECTED", code


async def allowed_fs_read_reaches_the_adapter_once(make: VmSandboxFactory) -> None:
    fs = InMemoryFs({"data/a.txt": b"hello"})
    sb = await _with(
        make,
        "import suaveplan\n\ndef f():\n    return suaveplan.fs.read_bytes('./data/a.txt')\n",
        proxies=Adapters(fs=fs),
    )
    try:
        assert await sb.call("f") == b"hello"
        assert [c for c in fs.calls if c[0] == "read_bytes"] == [("read_bytes", "data/a.txt")], (
            fs.calls
        )
    finally:
        await sb.dispose()


async def denied_fetch_never_reaches_the_adapter(make: VmSandboxFactory) -> None:
    fetch = FakeFetch()
    metrics = InMemoryMetrics()
    sb = await _with(
        make,
        "import suaveplan\n\ndef f():\n    return suaveplan.fetch('https://evil.example.net/x')\n",
        proxies=Adapters(fetch=fetch),
        metrics=metrics,
    )
    try:
        code = await _code_of(sb.call("f"))
        assert code == "SAND_PERM_DENIED", code
        assert fetch.requests == []
        total = metrics.value("plugin.permission_denied_total", capability="fetch")
        assert total == 1, metrics.samples()
    finally:
        await sb.dispose()


async def builtin_module_import_is_rejected_at_create(make: VmSandboxFactory) -> None:
    code: str | None
    try:
        sb = await _with(make, "import os\n\ndef f():\n    return 1\n")
    except SuaveplanError as exc:
        code = exc.code
    else:
        await sb.dispose()
        code = None
    assert code == "SAND_VM_MODULE_IMPORT_FORBIDDEN", code


async def dispose_twice_is_a_noop(make: VmSandboxFactory) -> None:
    fs = InMemoryFs({"data/a.txt": b"x"}, delay=30.0)
    sb = await _with(
        make,
        "import suaveplan\n\ndef f():\n    return suaveplan.fs.read_bytes('./data/a.txt')\n",
        proxies=Adapters(fs=fs),
    )
    call = asyncio.ensure_future(sb.call("f"))
    for _ in range(200):
        await asyncio.sleep(0.005)
        if fs.calls:
            break
    assert fs.calls, "the slow adapter call never started"
    await sb.dispose()
    await sb.dispose()
    code = await _code_of(call)
    assert code == "SAND_VM_DISPOSED", code
    assert await _code_of(sb.call("f")) == "SAND_VM_DISPOSED"


class _BroadcastBus:
    """A careless host bus: every event goes to every subscriber, whatever its pattern."""

    def __init__(self) -> None:
        self.handlers: list[EventHandler] = []

    async def publish(self, plugin: str, topic: str, payload: WireValue) -> None:
        for handler in list(self.handlers):
            await handler(topic, payload)

    async def subscribe(self, plugin: str, pattern: str, handler: EventHandler) -> _NoSub:
        self.handlers.append(handler)
        return _NoSub()


class _NoSub:
    async def close(self) -> None:
        return None


async def events_reach_subscribers_only_as_declared(make: VmSandboxFactory) -> None:
    bus, metrics = _BroadcastBus(), InMemoryMetrics()
    manifest = {**_MANIFEST, "events": {"subscribes": ["orders.*"]}}
    sb = await _with(
        make,
        "from suaveplan import events\n\nSEEN = []\n\n"
        "@events.subscribe('orders.*')\ndef on(payload):\n    SEEN.append(payload)\n\n"
        "def seen():\n    return SEEN\n",
        proxies=Adapters(events=bus),
        metrics=metrics,
        manifest=manifest,
    )
    try:
        assert bus.handlers, "the plugin's subscription never reached the host's bus"
        await bus.publish("host", "payroll.salaries", {"leak": True})
        await bus.publish("host", "orders.created", {"id": 1})
        seen: object = []
        for _ in range(200):
            seen = await sb.call("seen")
            if seen:
                break
            await asyncio.sleep(0.01)
        assert seen == [{"id": 1}], seen
        denied = metrics.value("plugin.permission_denied_total", capability="events")
        assert denied >= 1, metrics.samples()
    finally:
        await sb.dispose()


VM_SCENARIOS: Final[list[tuple[str, Scenario]]] = [
    ("process global is unreachable", process_global_is_unreachable),
    ("builtins are frozen", builtins_are_frozen),
    ("direct eval is rejected", direct_eval_is_rejected),
    ("indirect eval is rejected", indirect_eval_is_rejected),
    ("allowed fs read reaches the adapter once", allowed_fs_read_reaches_the_adapter_once),
    ("denied fetch never reaches the adapter", denied_fetch_never_reaches_the_adapter),
    ("built-in module import is rejected at create", builtin_module_import_is_rejected_at_create),
    ("dispose twice is a no-op", dispose_twice_is_a_noop),
    (
        "events reach subscribers only as declared",
        events_reach_subscribers_only_as_declared,
    ),
]


def run_vm_sandbox_conformance(label: str, make_sandbox: VmSandboxFactory) -> None:
    """Run every scenario; raise AssertionError naming the first that fails."""
    for name, scenario in VM_SCENARIOS:
        try:
            asyncio.run(scenario(make_sandbox))
        except AssertionError as exc:
            raise AssertionError(f"{label}: vm scenario {name!r} failed: {exc}") from exc
