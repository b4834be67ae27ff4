"""A plugin holding a secret cannot make the host log or report it.

The attacker's side: the plugin reads `API_KEY`, then puts it everywhere the host might
write a diagnostic: a fetch URL's query and userinfo, a header and a body (to a host proxy
that fails with all of them in its exception text), SQL text and parameters, an fs path, its
own exceptions and its log lines; an escaped worker also writes it into an error's code,
detail keys and cause chain. Everything the host then holds or emits is collected: every log
record at DEBUG (the gateway's and the VM host's tracebacks included), the audit lines with
resources, metric samples, `logs`, `denials` and every error as `str`, `repr`, `to_wire()`
and traceback. No form of the value may appear there (literal, percent-encoded as the
checker normalises URLs, repr/JSON/bytes escaped, SQL-quoted); `[REDACTED]` shows where it
was. The plugin's own data channel is untouched: it still gets, and may return, the value.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import traceback
from pathlib import Path
from urllib.parse import quote

import msgpack
import pytest
from test_hostile_worker_frames import RAW_PRELUDE

from suaveplan_sandbox.adapters import (
    Adapters,
    BeneathRootFs,
    JsonLinesAudit,
    SqliteDb,
    StaticSecrets,
)
from suaveplan_sandbox.adapters._protocols import HttpRequest, HttpResponse
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.errors._redact import REDACTED
from suaveplan_sandbox.metrics import InMemoryMetrics
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy
from suaveplan_sandbox.vm import VmSandbox, create_vm_sandbox
from suaveplan_sandbox.vm import _sandbox as vm_sandbox_module
from suaveplan_sandbox.vm._guest import PluginBundle, load_plugin

SECRET = "s3cr3t=Zq'9 x\u00e9-K"

PLUGIN = """
import suaveplan
from suaveplan import db, fs, log, secrets


def leak(kind):
    s = secrets.get("API_KEY")
    if kind == "fetch-query":
        suaveplan.fetch("https://api.example.com/v1?token=" + s)
    elif kind == "fetch-userinfo":
        suaveplan.fetch("https://user:" + s + "@api.example.com/")
    elif kind == "fetch-header":
        suaveplan.fetch("https://api.example.com/", headers={"Authorization": "Bearer " + s})
    elif kind == "fetch-body":
        suaveplan.fetch("https://api.example.com/", method="POST", body=s)
    elif kind == "db-literal":
        db.query("SELECT v FROM p_t WHERE v = '" + s.replace("'", "''") + "' AND nope = 1")
    elif kind == "db-param":
        db.query("INSERT INTO p_t (v) VALUES (?)", [s, s])
    elif kind == "fs-path":
        fs.read_bytes("./data/" + s)
    elif kind == "raise":
        raise ValueError("the token " + s + " was refused")
    elif kind == "raise-key":
        return {}[s]
    elif kind == "log":
        print("token", s)
        print(repr(s), repr(s.encode()))
        log.error("token=%s", s)
        return None
    elif kind == "return":
        return s
    return "no error?"
"""


class LeakyFetch:
    """A host proxy that fails with the request (URL, headers, body) in its exception text,
    as library exceptions often do."""

    async def request(self, request: HttpRequest) -> HttpResponse:
        raise RuntimeError(
            f"connecting to {request.url} with {request.headers!r} and {request.body!r} failed"
        )


def _forms(policy: PermissionPolicy) -> set[str]:
    """Every form the secret takes on its way to a diagnostic."""
    checker = PermissionChecker(policy)
    normalised = set()
    for url in (
        f"https://api.example.com/v1?token={SECRET}",
        f"https://user:{SECRET}@api.example.com/",
    ):
        target = checker.check_fetch(url).target  # type: ignore[union-attr]
        assert target is not None
        normalised.add(target.split("token=")[-1].split("user:")[-1].split("@")[0])
    return normalised | {
        SECRET,
        quote(SECRET, safe=""),
        repr(SECRET)[1:-1],
        ascii(SECRET)[1:-1],
        json.dumps(SECRET)[1:-1],
        repr(SECRET.encode())[2:-1],
        SECRET.replace("'", "''"),
        "Zq'9",  # a fragment: nothing partial either
    }


def _policy(root: Path) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {
            "name": "leaky",
            "secrets": [{"name": "API_KEY"}],
            "permissions": {"fetch": ["api.example.com"], "fs": ["./data/*"]},
            "database": {"tablePrefix": "p_"},
        },
        root=root,
    )


def _db(root: Path) -> SqliteDb:
    conn = sqlite3.connect(root / "db.sqlite3")
    conn.execute("CREATE TABLE p_t (v TEXT)")
    conn.commit()
    conn.close()
    return SqliteDb(root / "db.sqlite3", plugin_prefix="p_")


def _texts(err: BaseException) -> list[str]:
    texts = [str(err), repr(err), "".join(traceback.format_exception(err))]
    if isinstance(err, SuaveplanError):
        texts.append(json.dumps(err.to_wire()))
    return texts


async def _sandbox(
    root: Path, metrics: InMemoryMetrics, *, source: str = PLUGIN, raw: bool = False
) -> VmSandbox:
    (root / "data").mkdir()
    (root / "p.py").write_text(source)
    return await create_vm_sandbox(
        plugin_module_path=root / "p.py",
        policy=_policy(root),
        proxies=Adapters(
            secrets=StaticSecrets({"API_KEY": SECRET}),
            fetch=LeakyFetch(),  # type: ignore[arg-type]
            fs=BeneathRootFs(root),
            db=_db(root),
        ),
        metrics=metrics,
        audit=JsonLinesAudit(include_resource=True, denials_per_s=None),
    )


KINDS = (
    "fetch-query",
    "fetch-userinfo",
    "fetch-header",
    "fetch-body",
    "db-literal",
    "db-param",
    "fs-path",
    "raise",
    "raise-key",
)


async def test_a_plugin_cannot_put_its_secret_into_any_host_diagnostic(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # the operator's traceback loggers too
    metrics = InMemoryMetrics()
    texts: list[str] = []
    async with await _sandbox(tmp_path, metrics) as sb:
        assert await sb.call("leak", "return") == SECRET  # its data: not rewritten
        codes = {}
        for kind in KINDS:
            with pytest.raises(SuaveplanError) as info:
                await sb.call("leak", kind)
            codes[kind] = info.value.code
            texts += _texts(info.value)
        assert await sb.call("leak", "log") is None
        texts += [repr(sb.logs), repr(sb.denials)]
        logs = "\n".join(text for _, text in sb.logs)
        errors = "\n".join(texts)
    texts += [caplog.text, repr(metrics.samples())]
    texts += [r.getMessage() + repr(r.__dict__) for r in caplog.records]
    # Every route was really taken: the requests reached their adapters.
    assert codes == {
        **dict.fromkeys(("fetch-query", "fetch-userinfo"), "SAND_ADAPTER_FAILED"),
        **dict.fromkeys(("fetch-header", "fetch-body"), "SAND_ADAPTER_FAILED"),
        **dict.fromkeys(("db-literal", "db-param"), "SAND_DB_ERROR"),
        "fs-path": "SAND_FS_NOT_FOUND",
        **dict.fromkeys(("raise", "raise-key"), "SAND_VM_PLUGIN_ERROR"),
    }
    audit = [json.loads(r.getMessage()) for r in caplog.records if r.name.endswith(".audit")]
    resources = [line["resource"] for line in audit if line.get("capability") != "secrets"]
    assert len(resources) == 7, audit  # 4 fetches, 2 queries, 1 read
    assert resources == [
        f"https://api.example.com/v1?token={REDACTED}",
        f"https://user:{REDACTED}@api.example.com/",
        "https://api.example.com/",
        "https://api.example.com/",
        f"SELECT v FROM p_t WHERE v = '{REDACTED}' AND nope = 1",
        "INSERT INTO p_t (v) VALUES (?)",
        f"data/{REDACTED}",
    ]
    tracebacks = [r for r in caplog.records if r.name.endswith(".traceback")]
    assert len(tracebacks) == 4  # one per failed fetch
    assert all(REDACTED in r.getMessage() for r in tracebacks)
    assert all(r.exc_info is None for r in caplog.records)
    assert REDACTED in errors  # the plugin's own exception text, with the value cut out
    assert logs.count(REDACTED) >= 4
    for form in _forms(_policy(tmp_path)):
        for text in texts:
            assert form not in text, (form, text[:2000])


ESCAPED = (
    RAW_PRELUDE
    + """
def forge(hostcall, frames):
    fd = _fd()
    os.write(fd, hostcall)
    os.read(fd, 65536)  # the host's reply: the secret, now handed out
    for frame in frames:
        os.write(fd, frame)
    import time
    time.sleep(3600)
"""
)


def _frame(obj: object) -> bytes:
    body: bytes = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


async def test_an_escaped_worker_cannot_smuggle_the_secret_through_error_fields_or_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    def unchecked(path: str | Path) -> PluginBundle:
        return load_plugin(path, _without_interpreter_layer=True)

    monkeypatch.setattr(vm_sandbox_module, "load_plugin", unchecked)
    async with await _sandbox(tmp_path, InMemoryMetrics(), source=ESCAPED) as sb:
        call_id = sb._next_id + 1
        error = {
            "code": SECRET,  # unknown: kept as details.original_code
            "message": f"message {json.dumps(SECRET)}",
            "details": {SECRET: quote(SECRET, safe=""), "nested": [[{"k": SECRET}]]},
            "cause": {"code": "SAND_FS_NOT_FOUND", "message": repr(SECRET.encode())},
        }
        frames = [
            _frame(["log", "warning", json.dumps({"token": SECRET})]),
            _frame(["log", "error", f"GET /?t={quote(SECRET, safe='')}"]),
            _frame(["failure", call_id, error]),
        ]
        hostcall = _frame(["hostcall", 1, "secrets", "get", {"name": "API_KEY"}])
        with pytest.raises(SuaveplanError) as info:
            await asyncio.wait_for(sb.call("forge", hostcall, frames), 30)
        err = info.value
        assert err.code == "SAND_UNKNOWN_ERROR"
        assert err.details["original_code"] == REDACTED
        assert REDACTED in err.details
        assert isinstance(err.cause, SuaveplanError)
        assert REDACTED in err.cause.message
        texts = [*_texts(err), repr(sb.logs), caplog.text]
        assert len(sb.logs) >= 3
        assert all(REDACTED in text for _, text in sb.logs[-2:])
    for form in _forms(_policy(tmp_path)):
        for text in texts:
            assert form not in text, (form, text[:2000])


async def test_an_unexpected_host_failure_is_logged_without_its_text_or_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A bug under the gateway (its exception text holding what the plugin sent) is logged by
    # type and correlation id; the scrubbed traceback only at DEBUG, never `exc_info`.
    caplog.set_level(logging.DEBUG)
    async with await _sandbox(tmp_path, InMemoryMetrics()) as sb:
        assert await sb.call("leak", "return") == SECRET
        real = sb._gateway.dispatch_eager

        def broken(capability: object, operation: object, args: object) -> tuple[bool, object]:
            if capability == "fs":
                raise KeyError(f"no handler for {args!r}")
            return real(capability, operation, args)

        monkeypatch.setattr(sb._gateway, "dispatch_eager", broken)
        with pytest.raises(SuaveplanError) as info:
            await sb.call("leak", "fs-path")
        err = info.value
        assert err.code == "SAND_ADAPTER_FAILED"  # relayed by the plugin, which did not catch it
        assert set(err.details) == {"correlation_id"}
        failed = [r for r in caplog.records if "host call failed" in r.getMessage()]
        assert len(failed) == 1
        assert failed[0].exc_info is None
        assert "KeyError" in failed[0].getMessage()
        traced = [r for r in caplog.records if r.name == "suaveplan_sandbox.vm.traceback"]
        assert len(traced) == 1
        assert REDACTED in traced[0].getMessage()
        assert "no handler for" in traced[0].getMessage()
    for form in _forms(_policy(tmp_path)):
        assert form not in caplog.text
