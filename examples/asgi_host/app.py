"""A small ASGI host: run a Python plugin under its manifest, one sandbox per request.

`POST /run` takes a JSON body (media type `application/json`)::

    {
      "manifest": {"name": "demo", "kind": "python", "permissions": {"fs": ["./in/*"]}},
      "plugin": "from suaveplan import fs\\ndef main(p):\\n    return fs.read_text(p)\\n",
      "call": "main",
      "args": ["/in/a.txt"],
      "files": {"in/a.txt": "hello"}
    }

`manifest` is the manifest as a JSON object (the same fields as `manifest.toml`), `plugin`
the source of one module, `call` a public top-level function, `args` its arguments, `files`
optional text files seeded into the plugin's root. Each request gets a fresh temp directory
as the plugin's root, the library's standard adapters on it (`open_standard_adapters`:
`BeneathRootFs`, `HttpxFetch`, `SqliteDb`, an event bus, the host's configured secrets), and
its own worker; everything is removed when the response is sent.

Responses are JSON: `{"result": ..., "decisions": [...]}` on success, otherwise
`{"error": {"code", "message", "details"}, "decisions": [...]}` with the status from
`STATUS_BY_CODE` (403 refused, 429 over budget, 400 invalid manifest or request, 404 no such
function, 413 body too large, 415 not JSON, 422 the plugin failed). `GET /metrics` is
Prometheus text from `suaveplan_sandbox.metrics.PrometheusMetrics`.

Run it: `.venv/bin/python examples/asgi_host/app.py --port 8000` (loopback only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from suaveplan_sandbox.adapters import AuditRecord, open_standard_adapters
from suaveplan_sandbox.errors import SuaveplanError, define_codes
from suaveplan_sandbox.metrics import PrometheusMetrics
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox

CODES: Final = define_codes(
    "examples.asgi_host",
    {
        "ASGI_HOST_REQUEST_INVALID": "The request body is not the JSON object /run expects; "
        "`details.field` names the offending field.",
        "ASGI_HOST_REQUEST_TOO_LARGE": "The request body is larger than the host accepts.",
        "ASGI_HOST_MEDIA_TYPE": "The request body must be application/json.",
        "ASGI_HOST_BUDGET_TOO_HIGH": "The manifest asks for a budget above the host's ceiling.",
        "ASGI_HOST_INTERNAL": "The host failed unexpectedly; the log has the detail.",
    },
)

STATUS_BY_CODE: Final[Mapping[str, int]] = {
    "SAND_PERM_DENIED": 403,
    "BUDGET_EXCEEDED": 429,
    "SAND_MANIFEST_INVALID": 400,
    "SAND_INVALID_ARGUMENT": 400,
    "ASGI_HOST_REQUEST_INVALID": 400,
    "ASGI_HOST_BUDGET_TOO_HIGH": 400,
    "SAND_VM_NO_SUCH_FUNCTION": 404,
    "ASGI_HOST_REQUEST_TOO_LARGE": 413,
    "ASGI_HOST_MEDIA_TYPE": 415,
    "SAND_VM_HARDENING_UNAVAILABLE": 503,
    "SAND_VM_FORK_SERVER_FAILED": 503,
    "ASGI_HOST_INTERNAL": 500,
}
"""HTTP status per error code; any other coded error (the plugin's fault) is 422."""

# A seeded file path: relative, plain segments, no `.`/`..` and nothing the shell would mind.
_SEGMENT: Final = r"[A-Za-z0-9_-][A-Za-z0-9_.-]*"
_SEEDED_PATH: Final = re.compile(rf"^{_SEGMENT}(?:/{_SEGMENT})*$")
_FUNCTION_NAME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclass(frozen=True, kw_only=True)
class HostLimits:
    """What one request may ask for. Budgets missing from a manifest get the ceiling."""

    max_body_bytes: int = 256 * 1024
    max_files: int = 32
    wall_clock_ms: int = 5_000
    memory_mb: int = 256
    cpu_percent: int = 100
    concurrent_sandboxes: int = 2
    require_hardening: tuple[str, ...] = ()
    secrets: Mapping[str, str] = field(default_factory=dict)


class _CollectDecisions:
    """An audit sink that keeps this request's decisions for the response (no resources)."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def record(self, entry: AuditRecord) -> None:
        self.entries.append(
            {
                "capability": entry.capability,
                "operation": entry.operation,
                "allowed": entry.allowed,
                "reason": entry.reason,
                "rule": entry.rule,
            }
        )


def _plain(value: object) -> object:
    """Results are plain data already (msgpack types); bytes become hex for JSON."""
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _invalid(field_name: str, message: str) -> SuaveplanError:
    return SuaveplanError(
        CODES["ASGI_HOST_REQUEST_INVALID"], message, details={"field": field_name}
    )


def _error_response(exc: SuaveplanError, decisions: list[dict[str, Any]]) -> JSONResponse:
    wire = exc.to_wire()
    body = {
        "error": {"code": wire["code"], "message": wire["message"], "details": wire["details"]},
        "decisions": decisions,
    }
    return JSONResponse(body, status_code=STATUS_BY_CODE.get(exc.code, 422))


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    too_large = SuaveplanError(
        CODES["ASGI_HOST_REQUEST_TOO_LARGE"],
        "request body too large",
        details={"limit_bytes": limit},
    )
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _with_budgets(manifest: dict[str, Any], limits: HostLimits) -> dict[str, Any]:
    """Fill missing budgets with the host's ceiling and refuse any above it."""
    permissions = manifest.setdefault("permissions", {})
    if not isinstance(permissions, dict):
        return manifest  # the manifest validator reports it with its field path
    budgets = permissions.setdefault("budgets", {})
    if not isinstance(budgets, dict):
        return manifest
    for name, ceiling in (
        ("wallClockMs", limits.wall_clock_ms),
        ("memoryMb", limits.memory_mb),
        ("cpuPercent", limits.cpu_percent),
    ):
        value = budgets.setdefault(name, ceiling)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > ceiling:
            raise SuaveplanError(
                CODES["ASGI_HOST_BUDGET_TOO_HIGH"],
                "the manifest asks for more than this host allows",
                details={"budget": name, "ceiling": ceiling},
            )
    return manifest


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    manifest: dict[str, Any]
    plugin: str
    call: str
    args: list[Any]
    files: dict[str, str]


def parse_run_request(body: bytes, limits: HostLimits) -> RunRequest:
    """Validate the JSON body of `POST /run` into plain types (never evaluates anything)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise _invalid("body", "the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise _invalid("body", "the body must be a JSON object")
    unknown = sorted(set(data) - {"manifest", "plugin", "call", "args", "files"})
    if unknown:
        raise _invalid(unknown[0], "unknown field")
    manifest, plugin, call = data.get("manifest"), data.get("plugin"), data.get("call")
    args, files = data.get("args", []), data.get("files", {})
    if not isinstance(manifest, dict):
        raise _invalid("manifest", "manifest must be a JSON object")
    if not isinstance(plugin, str) or not plugin.strip():
        raise _invalid("plugin", "plugin must be the plugin's Python source")
    if not isinstance(call, str) or not _FUNCTION_NAME.match(call):
        raise _invalid("call", "call must name a public top-level function")
    if not isinstance(args, list):
        raise _invalid("args", "args must be a JSON list")
    if not isinstance(files, dict) or len(files) > limits.max_files:
        raise _invalid("files", f"files must be an object of at most {limits.max_files} entries")
    for name, text in files.items():
        segments = name.split("/")
        if not _SEEDED_PATH.match(name) or len(name) > 1024 or max(map(len, segments)) > 255:
            raise _invalid(f"files.{name}", "a relative path of plain segments")
        if any("/".join(segments[:i]) in files for i in range(1, len(segments))):
            raise _invalid(f"files.{name}", "a file cannot also be a directory")
        if not isinstance(text, str):
            raise _invalid(f"files.{name}", "file contents must be text")
    return RunRequest(manifest=manifest, plugin=plugin, call=call, args=args, files=files)


async def run_in_sandbox(
    req: RunRequest, *, limits: HostLimits, metrics: PrometheusMetrics, audit: _CollectDecisions
) -> Any:
    """One request, one temp root, one worker; all of it gone when this returns."""
    if req.manifest.get("kind", "python") != "python":
        raise _invalid("manifest.kind", "this host runs Python plugins only")
    with tempfile.TemporaryDirectory(prefix="suaveplan-asgi-") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        for name, text in req.files.items():
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        plugin_dir = Path(tmp) / "plugin"  # outside the root: the plugin cannot read itself
        plugin_dir.mkdir()
        plugin_file = plugin_dir / "plugin.py"
        plugin_file.write_text(req.plugin)
        policy = PermissionPolicy.from_manifest(_with_budgets(req.manifest, limits), root=root)
        # The library's production set for what the manifest grants: fs beneath the root,
        # public-only fetch, SQLite (with migrations) under the request's data dir, a private
        # event bus, and only the secrets this host was configured with.
        async with (
            await open_standard_adapters(
                policy, data_dir=Path(tmp) / "data", secrets=dict(limits.secrets)
            ) as standard,
            await create_vm_sandbox(
                plugin_module_path=plugin_file,
                policy=policy,
                proxies=standard.adapters,
                metrics=metrics,
                audit=audit,
                require_hardening=limits.require_hardening,
            ) as sb,
        ):
            return await sb.call(req.call, *req.args)


def create_app(limits: HostLimits | None = None) -> Starlette:
    """The ASGI app. Each app has its own Prometheus registry (`app.state.registry`)."""
    limits = limits or HostLimits()
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    gate = asyncio.Semaphore(limits.concurrent_sandboxes)

    async def run(request: Request) -> Response:
        audit = _CollectDecisions()
        try:
            media_type = request.headers.get("content-type", "").split(";")[0].strip()
            if media_type != "application/json":
                raise SuaveplanError(CODES["ASGI_HOST_MEDIA_TYPE"], "send application/json")
            req = parse_run_request(await _read_body(request, limits.max_body_bytes), limits)
            async with gate:
                result = await run_in_sandbox(req, limits=limits, metrics=metrics, audit=audit)
        except SuaveplanError as exc:
            return _error_response(exc, audit.entries)
        except Exception as exc:
            print(f"asgi_host: internal error: {exc!r}", file=sys.stderr)
            return _error_response(
                SuaveplanError(CODES["ASGI_HOST_INTERNAL"], "internal error"), audit.entries
            )
        return JSONResponse({"result": _plain(result), "decisions": audit.entries})

    async def prometheus(_request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(
        routes=[
            Route("/run", run, methods=["POST"]),
            Route("/metrics", prometheus, methods=["GET"]),
        ]
    )
    app.state.registry = registry
    return app


def main(argv: list[str] | None = None) -> int:
    """Serve on loopback; prints `listening on http://127.0.0.1:PORT` once bound."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument(
        "--require-hardening",
        default="",
        help="comma-separated layers to insist on, e.g. landlock_fs,landlock_net,seccomp",
    )
    ns = parser.parse_args(argv)
    required = tuple(layer for layer in ns.require_hardening.split(",") if layer)
    config = uvicorn.Config(
        create_app(HostLimits(require_hardening=required)),
        host="127.0.0.1",
        port=ns.port,
        log_level="warning",
    )
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            port = server.servers[0].sockets[0].getsockname()[1]
            print(f"listening on http://127.0.0.1:{port}", flush=True)
        await task

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
