"""The ASGI host example, driven over real HTTP on loopback (uvicorn in a subprocess)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

APP = Path(__file__).parents[2] / "examples" / "asgi_host" / "app.py"

PLUGIN = """\
from suaveplan import fs


def read(path):
    return fs.read_text(path)


def spin():
    n = 0
    while True:
        n += 1
"""


def _manifest(**budgets: int) -> dict[str, Any]:
    permissions: dict[str, Any] = {"fs": ["./in/*"]}
    if budgets:
        permissions["budgets"] = budgets
    return {"name": "http-demo", "kind": "python", "permissions": permissions}


def _body(call: str, *args: Any, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "manifest": manifest or _manifest(),
        "plugin": PLUGIN,
        "call": call,
        "args": list(args),
        "files": {"in/a.txt": "hello from the host"},
    }


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, str(APP), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line: list[str] = []
    reader = threading.Thread(
        target=lambda: line.append(proc.stdout.readline() if proc.stdout else "")
    )
    reader.start()
    reader.join(timeout=60)
    try:
        assert line and line[0].startswith("listening on http://127.0.0.1:"), (
            line,
            proc.poll(),
        )
        yield line[0].split()[-1]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _counter(base_url: str, family: str, **labels: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    for fam in text_string_to_metric_families(text):
        if fam.name != family:
            continue
        for sample in fam.samples:
            if sample.name.endswith("_total") and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                return float(sample.value)
    return 0.0


def test_an_allowed_call_returns_the_result_and_its_decisions(base_url: str) -> None:
    r = httpx.post(f"{base_url}/run", json=_body("read", "/in/a.txt"), timeout=30)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["result"] == "hello from the host"
    assert [(d["capability"], d["allowed"], d["rule"]) for d in data["decisions"]] == [
        ("fs", True, "./in/*")
    ]


def test_a_denied_capability_is_403_with_the_code_and_is_counted_in_metrics(
    base_url: str,
) -> None:
    labels = {"plugin": "http-demo", "capability": "fs", "reason": "path-not-in-allowlist"}
    before = _counter(base_url, "plugin_permission_denied", **labels)
    r = httpx.post(f"{base_url}/run", json=_body("read", "/etc/passwd"), timeout=30)
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert error["code"] == "SAND_PERM_DENIED"
    assert error["details"] == {"capability": "fs", "reason": "path-not-in-allowlist"}
    assert "passwd" not in r.text  # the denial never names the path
    assert _counter(base_url, "plugin_permission_denied", **labels) == before + 1


def test_a_budget_breach_is_429_budget_exceeded_and_counted(base_url: str) -> None:
    before = _counter(base_url, "plugin_budget_exceeded", plugin="http-demo", budget="wallClockMs")
    body = _body("spin", manifest=_manifest(wallClockMs=300))
    r = httpx.post(f"{base_url}/run", json=body, timeout=60)
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert error["code"] == "BUDGET_EXCEEDED"
    assert error["details"]["budget"] == "wallClockMs"
    after = _counter(base_url, "plugin_budget_exceeded", plugin="http-demo", budget="wallClockMs")
    assert after == before + 1


def test_an_invalid_manifest_is_400_with_the_field_path(base_url: str) -> None:
    manifest = _manifest()
    manifest["permissions"]["fs"] = ["/etc/*"]
    r = httpx.post(
        f"{base_url}/run", json=_body("read", "/in/a.txt", manifest=manifest), timeout=30
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "SAND_MANIFEST_INVALID"
    assert [e["path"] for e in error["details"]["errors"]] == ["permissions.fs[0]"]


def test_a_budget_above_the_hosts_ceiling_is_refused_before_any_worker(base_url: str) -> None:
    body = _body("read", "/in/a.txt", manifest=_manifest(wallClockMs=10**9))
    r = httpx.post(f"{base_url}/run", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "ASGI_HOST_BUDGET_TOO_HIGH"
    assert r.json()["error"]["details"]["budget"] == "wallClockMs"


def test_an_unknown_function_is_404(base_url: str) -> None:
    r = httpx.post(f"{base_url}/run", json=_body("no_such_thing"), timeout=30)
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "SAND_VM_NO_SUCH_FUNCTION"


def test_an_oversized_body_is_413_before_it_is_parsed(base_url: str) -> None:
    body = _body("read", "/in/a.txt")
    body["files"] = {"in/big.txt": "x" * (300 * 1024)}
    r = httpx.post(f"{base_url}/run", json=body, timeout=30)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "ASGI_HOST_REQUEST_TOO_LARGE"


@pytest.mark.parametrize(
    ("content", "content_type", "expected"),
    [
        (b"{not json", "application/json", (400, "ASGI_HOST_REQUEST_INVALID", "body")),
        (b"[]", "application/json", (400, "ASGI_HOST_REQUEST_INVALID", "body")),
        (b"plugin=x", "application/x-www-form-urlencoded", (415, "ASGI_HOST_MEDIA_TYPE", None)),
    ],
)
def test_malformed_requests_get_a_coded_json_error(
    base_url: str, content: bytes, content_type: str, expected: tuple[int, str, str | None]
) -> None:
    status, code, field = expected
    r = httpx.post(
        f"{base_url}/run", content=content, headers={"content-type": content_type}, timeout=30
    )
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code
    assert error["details"].get("field") == field


@pytest.mark.parametrize(
    "name",
    ["../escape.txt", "/abs.txt", "in/../../x", "in//x", ".hidden/../x", "in/" + "x" * 256],
)
def test_seeded_files_cannot_name_a_path_outside_the_root(base_url: str, name: str) -> None:
    body = _body("read", "/in/a.txt")
    body["files"] = {name: "x"}
    r = httpx.post(f"{base_url}/run", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "ASGI_HOST_REQUEST_INVALID"
    assert r.json()["error"]["details"]["field"] == f"files.{name}"


def test_a_seeded_file_cannot_also_be_a_directory(base_url: str) -> None:
    body = _body("read", "/in/a.txt")
    body["files"] = {"in": "x", "in/a.txt": "y"}
    r = httpx.post(f"{base_url}/run", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["details"]["field"] == "files.in/a.txt"


def test_metrics_are_prometheus_text(base_url: str) -> None:
    r = httpx.get(f"{base_url}/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    names = {fam.name for fam in text_string_to_metric_families(r.text)}
    assert {"plugin_permission_denied", "plugin_budget_exceeded"} <= names


def test_a_deeply_nested_body_is_a_coded_400_not_a_crash(base_url: str) -> None:
    r = httpx.post(
        f"{base_url}/run",
        content=b"[" * 100_000 + b"]" * 100_000,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "code": "ASGI_HOST_REQUEST_INVALID",
        "message": "the body is not valid JSON",
        "details": {"field": "body"},
    }


def test_a_declared_database_gets_sqlite_with_the_seeded_migrations(base_url: str) -> None:
    plugin = (
        "from suaveplan import db\n\n\n"
        "def note(text):\n"
        "    db.query('INSERT INTO app_notes (body) VALUES (?)', [text])\n"
        "    return db.query('SELECT body FROM app_notes')\n\n\n"
        "def peek():\n"
        "    return db.query('SELECT * FROM sqlite_master')\n"
    )
    manifest = {
        "name": "notes",
        "kind": "python",
        "database": {"tablePrefix": "app_", "migrations": "migrations"},
    }
    files = {"migrations/001_notes.sql": "CREATE TABLE app_notes (body TEXT NOT NULL);"}
    body = {"manifest": manifest, "plugin": plugin, "call": "note", "args": ["hi"], "files": files}
    r = httpx.post(f"{base_url}/run", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["result"] == [{"body": "hi"}]
    # each request has its own database: nothing leaks from the previous one
    r = httpx.post(f"{base_url}/run", json=body, timeout=30)
    assert r.json()["result"] == [{"body": "hi"}]
    r = httpx.post(f"{base_url}/run", json={**body, "call": "peek", "args": []}, timeout=30)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["details"] == {"capability": "db", "reason": "statement-not-permitted"}
