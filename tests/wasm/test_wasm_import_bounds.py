"""Every `suaveplan.*` import, given any i32 arguments, answers a WASI errno: never a host
exception or a trap; a pointer or length reaching past guest memory is `FAULT`. (That no
access lands outside guest memory is `GuestMemory`'s contract: `test_wasm_memory.py`.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import pytest
import wasmtime
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing._fakes import DictSecrets, FakeDb, FakeFetch, InMemoryEvents
from suaveplan_sandbox.wasm import Errno, WasmSandbox, create_wasm_sandbox

ARITY: Final = {
    "sock_connect": 4,
    "sock_send": 4,
    "sock_recv": 4,
    "sock_close": 1,
    "secrets_get": 5,
    "events_publish": 4,
    "db_query": 7,
    "fetch": 5,
}


def _wat() -> str:
    imports, exports = [], []
    for name, n in ARITY.items():
        params = " ".join(["i32"] * n)
        imports.append(
            f'(import "suaveplan" "{name}" (func ${name} (param {params}) (result i32)))'
        )
        args = " ".join(f"(local.get {i})" for i in range(n))
        exports.append(
            f'(func (export "{name}") (param {params}) (result i32) (call ${name} {args}))'
        )
    # Two pages: 131072 bytes of guest memory.
    return (
        "(module "
        + " ".join(imports)
        + ' (memory (export "memory") 2)'
        + ' (data (i32.const 0) "SELECT 1")'
        + ' (data (i32.const 16) "API_KEY")'
        + ' (data (i32.const 32) "api.stripe.com")'
        + ' (data (i32.const 64) "{\\"url\\":\\"https://api.stripe.com/x\\"}")'
        + " "
        + " ".join(exports)
        + ' (func (export "answer") (result i32) (i32.const 42)))'
    )


_ERRNOS: Final = frozenset(int(e) for e in Errno)
# Mostly values near the ends of guest memory (2 pages = 131072 bytes) and of the i32 range.
_I32: Final = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([0, 1, 16, 7, 64, 131071, 131072, 131073, 65536, -1, -(2**31), 2**31 - 1]),
    st.integers(131072 - 64, 131072 + 64),
)


@pytest.fixture
async def sandbox(root: Path, tmp_path: Path) -> AsyncIterator[WasmSandbox]:
    path = tmp_path / "bounds.wasm"
    path.write_bytes(wasmtime.wat2wasm(_wat()))
    fetch = FakeFetch()
    policy = PermissionPolicy.from_manifest(
        {
            "name": "guest",
            "permissions": {"fetch": ["api.stripe.com"]},
            "secrets": [{"name": "API_KEY"}],
            "events": {"publishes": ["guest.*"]},
            "database": {"tablePrefix": "guest_"},
        },
        root=root,
    )
    sb = await create_wasm_sandbox(
        wasm_module_path=path,
        policy=policy,
        proxies=Adapters(
            secrets=DictSecrets({"API_KEY": "k"}), fetch=fetch, db=FakeDb(), events=InMemoryEvents()
        ),
    )
    try:
        yield sb
    finally:
        await sb.dispose()
        fetch.close()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), name=st.sampled_from(sorted(ARITY)))
async def test_any_arguments_to_any_import_get_an_errno(
    sandbox: WasmSandbox, data: st.DataObject, name: str
) -> None:
    args = [data.draw(_I32) for _ in range(ARITY[name])]
    result = await sandbox.call(name, *args)
    assert result in _ERRNOS, (name, args, result)
    assert sandbox.state == "ready"
    assert await sandbox.call("answer") == 42


@pytest.mark.parametrize(
    "name", ["db_query", "events_publish", "fetch", "secrets_get", "sock_connect"]
)
async def test_an_input_one_byte_past_guest_memory_is_fault(
    sandbox: WasmSandbox, name: str
) -> None:
    args = [0] * ARITY[name]
    args[0], args[1] = 2 * 65536 - 4, 5  # the input (ptr, len) ends one byte past memory
    assert await sandbox.call(name, *args) == Errno.FAULT


async def test_socket_buffers_past_guest_memory_are_fault(sandbox: WasmSandbox) -> None:
    end = 2 * 65536
    assert await sandbox.call("sock_connect", 32, 14, 443, end - 4) == Errno.SUCCESS
    fd = 3  # a fresh sandbox's first socket handle
    assert await sandbox.call("sock_connect", 32, 14, 443, end - 3) == Errno.FAULT
    assert await sandbox.call("sock_send", fd, end - 4, 5, 0) == Errno.FAULT
    assert await sandbox.call("sock_send", fd, 0, 1, end - 3) == Errno.FAULT
    assert await sandbox.call("sock_recv", fd, end - 4, 5, 0) == Errno.FAULT
    assert await sandbox.call("sock_recv", fd, 0, 4, end - 3) == Errno.FAULT
    assert await sandbox.call("sock_close", fd) == Errno.SUCCESS
    assert await sandbox.call("sock_close", fd) == Errno.BADF
