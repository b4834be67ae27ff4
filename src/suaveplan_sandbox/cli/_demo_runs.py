"""Run the examples for real: the Python plugin in the VM host, the WASM one in wasmtime, and
the web host (`asgi_host`) as a loopback server driven over HTTP.

Each run works on a scratch copy of the example folder, so `make run` never changes the repo.
Each returns its exit status and a plain-data record of what happened (`demo --json` prints
the records; the console output says the same thing for people).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rich.console import Console

from suaveplan_sandbox._printable import printable
from suaveplan_sandbox.adapters import open_standard_adapters
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.metrics import PERMISSION_DENIED, InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionPolicy

_DEMO_KEY = "sk_test_demo"
# What the fake payment API reports as paid (in cents), per customer.
_CHARGES = [{"customer": "acme", "amount": 12050}, {"customer": "globex", "amount": 5000}]


class _FakePaymentApi(BaseHTTPRequestHandler):
    """`GET /v1/charges`: the charges above, for a caller with the demo key; else 401."""

    def do_GET(self) -> None:
        authorised = self.headers.get("Authorization") == f"Bearer {_DEMO_KEY}"
        ok = authorised and self.path.startswith("/v1/charges")
        body = json.dumps({"data": _CHARGES} if ok else {"error": "unauthorised"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


Record = dict[str, Any]


def plain(value: object) -> object:
    """A guest's result as JSON-ready data (tuples become lists, bytes hex, keys strings,
    a NaN or infinite float `{"float": "nan" | "inf" | "-inf"}`: `NaN` is not JSON)."""
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": str(value)}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def refusal(exc: SuaveplanError) -> Record:
    return {"code": exc.code, "message": exc.message, "details": plain(exc.details)}


@contextmanager
def fake_payment_api() -> Iterator[str]:
    """A loopback stand-in for the payment API; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakePaymentApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def run_python_example(folder: Path, console: Console) -> tuple[int, Record]:
    from suaveplan_sandbox.vm import create_vm_sandbox

    with tempfile.TemporaryDirectory(prefix="suaveplan-demo-") as tmp:
        root = Path(tmp) / folder.name
        shutil.copytree(folder, root)
        (root / "reports").mkdir(exist_ok=True)
        policy = PermissionPolicy.from_manifest(root / "manifest.toml", root=root)
        metrics = InMemoryMetrics()
        entry = root / (policy.manifest.entry or "plugin.py")
        # The library's standard set: fs, HTTP, SQLite with the migrations, events, secrets.
        async with (
            await open_standard_adapters(
                policy,
                data_dir=Path(tmp) / "data",
                secrets={"STRIPE_SECRET_KEY": _DEMO_KEY},
            ) as standard,
            await create_vm_sandbox(
                plugin_module_path=entry,
                policy=policy,
                proxies=standard.adapters,
                metrics=metrics,
            ) as sb,
        ):
            active = ", ".join(sb.hardening.active)
            console.print(f"[bold]{policy.plugin}[/]: Python worker hardened with {active}")
            calls: list[Record] = []
            totals = await sb.call("summarize", "march")
            calls.append({"call": "summarize", "args": ["march"], "result": plain(totals)})
            console.print(f"  summarize('march') -> {totals}")
            written = (root / "reports" / "march.txt").read_text()
            report = written.strip().replace("\n", "; ")
            console.print(f"  wrote reports/march.txt: {report}")
            with fake_payment_api() as api:
                owed = await sb.call("reconcile", "march", api)
            calls.append({"call": "reconcile", "args": ["march", api], "result": plain(owed)})
            console.print(f"  reconcile('march', <fake payment API on {api}>) -> {owed}")
            elsewhere = "https://payments.evil.example"
            for label, call, args in (
                (f"reconcile('march', {elsewhere!r})", "reconcile", ("march", elsewhere)),
                ("try_to_escape()", "try_to_escape", ()),
            ):
                attempt: Record = {"call": call, "args": list(args)}
                try:
                    attempt["result"] = plain(await sb.call(call, *args))
                except SuaveplanError as exc:
                    attempt["refused"] = refusal(exc)
                    console.print(f"  {label} refused: {exc.code} {exc.details}")
                calls.append(attempt)
            hardening = list(sb.hardening.active)
        denied = metrics.value(PERMISSION_DENIED.name)
        console.print(f"  plugin.permission_denied_total during the run: {denied:g}\n")
    return 0, {
        "hardening": hardening,
        "calls": calls,
        "files_written": {"reports/march.txt": written},
        "permission_denied_total": denied,
    }


async def run_wasm_example(folder: Path, console: Console) -> tuple[int, Record]:
    from suaveplan_sandbox.wasm import create_wasm_sandbox

    with tempfile.TemporaryDirectory(prefix="suaveplan-demo-") as tmp:
        root = Path(tmp) / folder.name  # the manifest's folder is the plugin's root
        shutil.copytree(folder, root)
        policy = PermissionPolicy.from_manifest(root / "manifest.toml", root=root)
        module = root / (policy.manifest.entry or "plugin.wasm")
        async with await create_wasm_sandbox(wasm_module_path=module, policy=policy) as sb:
            result = await sb.run(argv=[policy.plugin])
            denials = [refusal(exc) for exc in sb.denials]
            dirs = [{"guest": p.guest, "writable": p.writable} for p in sb.preopens]
        console.print(f"[bold]{policy.plugin}[/]: WASI module exited {result.exit_code}")
        stdout = result.stdout.decode(errors="replace").splitlines()
        for line in stdout:  # the guest's own output: markup and escapes shown as text
            console.print(f"  | {printable(line)}", markup=False)
        files: dict[str, str] = {}
        written = root / "output" / "result.txt"
        if written.exists():
            files["output/result.txt"] = written.read_text()
            console.print(f"  wrote output/result.txt: {written.read_text().strip()}")
        shown = ", ".join(f"{p['guest']} ({'rw' if p['writable'] else 'read-only'})" for p in dirs)
        console.print(f"  preopens from the fs rules: {shown or 'none'}")
        console.print(
            "  (WASI refuses the rest itself: a write to a read-only preopen is EPERM (63), a path"
            " outside every preopen does not exist for the guest, ENOENT (44))"
        )
        console.print(f"  host-side denials recorded: {len(denials)}\n")
        record: Record = {
            "preopens": dirs,
            "exit_code": result.exit_code,
            "stdout": stdout,
            "stderr": result.stderr.decode(errors="replace").splitlines(),
            "files_written": files,
            "host_denials": denials,
        }
        return (0 if result.exit_code == 0 else 1), record


def _wait_for_line(proc: subprocess.Popen[str], timeout: float) -> str:
    line: list[str] = []
    reader = threading.Thread(
        target=lambda: line.append(proc.stdout.readline() if proc.stdout else ""), daemon=True
    )
    reader.start()
    reader.join(timeout)
    return line[0] if line else ""


def _outcome(data: dict[str, object]) -> str:
    error = data.get("error")
    if not isinstance(error, dict):
        return f"result {json.dumps(data.get('result'))}"
    details = error.get("details")
    if isinstance(details, dict) and isinstance(details.get("errors"), list):
        paths = [e.get("path") for e in details["errors"] if isinstance(e, dict)]
        return f"{error.get('code')} at {', '.join(map(str, paths))}"
    return f"{error.get('code')} {json.dumps(details, sort_keys=True)}"


def run_asgi_example(folder: Path, console: Console) -> tuple[int, Record]:
    """Start the example web host on loopback, post its `requests.json`, show the answers."""
    import httpx

    plugin = (folder / "sample_plugin.py").read_text()
    requests = json.loads((folder / "requests.json").read_text())
    proc = subprocess.Popen(  # noqa: S603 - our own interpreter on our own example
        [sys.executable, str(folder / "app.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = _wait_for_line(proc, timeout=60)
        if not ready.startswith("listening on http://127.0.0.1:"):
            proc.kill()
            _, err = proc.communicate(timeout=10)
            last = (err.strip().splitlines() or ["no output"])[-1]
            console.print(f"[red]{folder.name}: the host did not start: {last}")
            console.print("  (it needs the `examples` extra: pip install -e '.[examples]')\n")
            return 1, {"kind": "host", "error": f"the host did not start: {last}"}
        base = ready.split()[-1]
        console.print(f"[bold]{folder.name}[/]: Starlette host listening on {base}")
        posts: list[Record] = []
        with httpx.Client(base_url=base, timeout=60) as client:
            for item in requests:
                body = {k: v for k, v in item.items() if k != "title"}
                reply = client.post("/run", json={**body, "plugin": plugin})
                data = reply.json()
                posts.append({"title": item["title"], "status": reply.status_code, **data})
                console.print(f"  POST /run {item['title']}", markup=False)
                console.print(
                    f"    -> {reply.status_code} {_outcome(data)}", markup=False, soft_wrap=True
                )
            metrics = client.get("/metrics").text
        console.print("  GET /metrics (non-zero plugin counters):")
        counters = [
            line
            for line in metrics.splitlines()
            if line.startswith("plugin_") and "_total{" in line and not line.endswith(" 0.0")
        ]
        for line in counters:
            console.print(f"  | {line}", markup=False, soft_wrap=True)
        console.print()
        return 0, {"kind": "host", "url": base, "requests": posts, "metrics": counters}
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
