"""VM host benchmarks: create, no-op call, proxied fs read, pool throughput (ratios only)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack

from benchmarks._harness import BenchRow, measure
from suaveplan_sandbox.adapters import Adapters
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.testing import InMemoryFs
from suaveplan_sandbox.vm import create_vm_sandbox

_SRC = (
    "import suaveplan\n\ndef noop():\n    return None\n\n"
    "def read():\n    return suaveplan.fs.read_bytes('./data/a.bin')\n"
)


# A fresh interpreter to the same ready point: our worker code imported.
_FRESH = (
    "import sys, json; sys.path[:0] = json.loads(sys.argv[1]); "
    "import suaveplan_sandbox.vm._worker_loop"
)


def _row(  # noqa: PLR0917
    name: str, value_s: float, baseline_name: str, baseline_s: float, target: str, ok: bool
) -> BenchRow:
    return BenchRow(
        name=name,
        value_s=value_s,
        baseline_name=baseline_name,
        baseline_s=baseline_s,
        target=target,
        ok=ok,
    )


def _raw_roundtrip(n: int) -> float:
    a, b = socket.socketpair()
    req = msgpack.packb(["call", 1, "noop", [], {}])
    frame = len(req).to_bytes(4, "big") + req
    t = time.perf_counter()
    for _ in range(n):
        a.sendall(frame)
        data = b.recv(65536)
        body = msgpack.unpackb(data[4:], raw=False)
        rep = msgpack.packb(["result", body[1], None])
        b.sendall(len(rep).to_bytes(4, "big") + rep)
        msgpack.unpackb(a.recv(65536)[4:], raw=False)
    a.close()
    b.close()
    return (time.perf_counter() - t) / n


def run() -> list[BenchRow]:
    root = Path(tempfile.mkdtemp(prefix="bench-vm-"))
    (root / "p.py").write_text(_SRC)
    policy = PermissionPolicy.from_manifest(
        {"name": "bench", "version": "1.0.0", "permissions": {"fs": ["./data/*"]}}, root=root
    )
    fs = InMemoryFs({"data/a.bin": b"x" * 1024})
    rows: list[BenchRow] = []

    async def main() -> None:
        async def create() -> None:
            sb = await create_vm_sandbox(
                plugin_module_path=str(root / "p.py"), policy=policy, proxies=Adapters(fs=fs)
            )
            await sb.dispose()

        await create()
        n = 20
        t = time.perf_counter()
        for _ in range(n):
            await create()
        create_s = (time.perf_counter() - t) / n
        fresh = measure(
            lambda: subprocess.run(
                [sys.executable, "-I", "-S", "-c", _FRESH, json.dumps(sys.path)], check=False
            ),
            number=3,
        )
        rows.append(
            _row(
                "vm.create",
                create_s,
                "fresh python -I -S",
                fresh,
                ">=4x faster",
                fresh / create_s >= 4,
            )
        )
        sb = await create_vm_sandbox(
            plugin_module_path=str(root / "p.py"), policy=policy, proxies=Adapters(fs=fs)
        )
        n = 2000
        raw = _raw_roundtrip(n)
        t = time.perf_counter()
        for _ in range(n):
            await sb.call("noop")
        call_s = (time.perf_counter() - t) / n
        rows.append(
            _row(
                "vm.call noop", call_s, "raw msgpack socketpair", raw, "<=1.5x", call_s <= 1.5 * raw
            )
        )
        t = time.perf_counter()
        for _ in range(500):
            await sb.call("read")
        read_s = (time.perf_counter() - t) / 500
        rows.append(
            _row(
                "vm.call fs.read_bytes 1KiB",
                read_s,
                "raw msgpack socketpair",
                raw,
                "<=2x",
                read_s <= 2 * raw,
            )
        )
        await sb.dispose()
        boxes = [
            await create_vm_sandbox(plugin_module_path=str(root / "p.py"), policy=policy)
            for _ in range(4)
        ]
        total = 4000
        t = time.perf_counter()
        await asyncio.gather(*(boxes[i % 4].call("noop") for i in range(total)))
        per = (time.perf_counter() - t) / total
        rows.append(
            _row(
                "vm.pool throughput (s/call)",
                per,
                "15,000 calls/s",
                1 / 15000,
                ">=15000/s",
                per <= 1 / 15000,
            )
        )
        for b in boxes:
            await b.dispose()

    asyncio.run(main())
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
