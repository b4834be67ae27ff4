"""`suaveplan-sandbox`: check and explain decisions, validate manifests, run the demo.

Exit codes (documented in the README and `--help`): 0 allow / success, 1 deny, 2 invalid
input (bad manifest, bad arguments), 3 internal error (also: the output could not be
written), 130 interrupted (Ctrl-C), 141 whoever read the output went away (EPIPE).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Final

import click

from suaveplan_sandbox._printable import printable
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import (
    Allow,
    Deny,
    PermissionChecker,
    PermissionPolicy,
    load_manifest,
)

EXIT_ALLOW: Final = 0
EXIT_DENY: Final = 1
EXIT_INVALID: Final = 2
EXIT_INTERNAL: Final = 3
# As a shell reports a process that a signal ended (128 + the signal): Ctrl-C (SIGINT), and
# a reader that went away (the SIGPIPE a C program would have died of), so a pipeline
# (`... | head -1`, `set -o pipefail`) never reads either as an allow, a deny or a bad input.
EXIT_INTERRUPTED: Final = 130
EXIT_BROKEN_PIPE: Final = 141

_BROAD_FS: Final = frozenset({"*", "./*", "rw:*", "rw:./*", "/*"})


def _emit(as_json: bool, payload: dict[str, Any], text: str) -> None:
    click.echo(json.dumps(payload, sort_keys=True) if as_json else text)


def _debug_enabled() -> bool:
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return bool(isinstance(obj, dict) and obj.get("debug"))


def _show_traceback(exc: BaseException) -> None:
    """With `--debug`, a coded error also shows where it came from (and its causes)."""
    if _debug_enabled():
        shown = "".join(traceback.format_exception(exc)).rstrip()
        click.echo(printable(shown, keep_newlines=True), err=True)


def _fail(as_json: bool, exc: SuaveplanError) -> int:
    _show_traceback(exc)
    if as_json:
        click.echo(json.dumps({"error": exc.to_wire()}, sort_keys=True))
    else:
        # The message may quote the manifest (an unknown key's name): escape what it holds.
        click.echo(printable(f"error {exc.code}: {exc.message}"), err=True)
    return EXIT_INVALID


def _decide(
    manifest: str, root: str, capability: str, payload: dict[str, Any], dialect: str
) -> tuple[Allow | Deny, dict[str, str] | None]:
    policy = PermissionPolicy.from_manifest(
        manifest,
        root=root,
        sql_dialect="postgres" if dialect == "postgres" else "sqlite",
    )
    checker = PermissionChecker(policy)
    if capability == "fs":
        decision = checker.check_fs(payload["path"], payload["mode"])
    elif capability == "fetch":
        decision = checker.check_fetch(payload["url"])
    else:
        decision = checker.check_capability(capability, payload)
    return decision, _near_miss(policy, checker, capability, payload, decision)


def _near_miss(
    policy: PermissionPolicy,
    checker: PermissionChecker,
    capability: str,
    payload: dict[str, Any],
    decision: Allow | Deny,
) -> dict[str, str] | None:
    """For the operator (never the guest): the rule a denied request almost matched."""
    if isinstance(decision, Allow):
        return None
    reason = decision.reason.value
    if capability == "fs" and reason == "mode-not-permitted":
        read = checker.check_fs(payload["path"], "read")
        if isinstance(read, Allow) and read.rule:
            return {"rule": read.rule, "why": "the rule is read-only; writing needs an rw: rule"}
    if capability == "fetch" and reason == "scheme-not-permitted":
        url = str(payload["url"])
        if url.lower().startswith("http://"):
            https = checker.check_fetch("https://" + url[len("http://") :])
            if isinstance(https, Allow) and https.rule:
                return {
                    "rule": https.rule,
                    "why": "the rule allows https; http needs an http: rule",
                }
    if capability == "db" and reason == "table-out-of-scope":
        prefix = policy.table_prefix
        if not prefix:
            return {"why": "the manifest has no [database] section"}
        return {"why": f"every table the SQL touches must start with {prefix!r}"}
    return None


def _report(
    as_json: bool, capability: str, decision: Allow | Deny, hint: dict[str, str] | None
) -> int:
    if isinstance(decision, Allow):
        _emit(
            as_json,
            {
                "decision": "allow",
                "capability": capability,
                "rule": decision.rule,
                "target": decision.target,
            },
            f"allow  {capability}  rule={decision.rule!r}  target={decision.target!r}",
        )
        return EXIT_ALLOW
    payload: dict[str, Any] = {
        "decision": "deny",
        "capability": capability,
        "reason": decision.reason.value,
    }
    text = f"deny   {capability}  reason={decision.reason.value}"
    if hint:
        payload["near_miss"] = hint
        if "rule" in hint:
            text += f"  near rule={hint['rule']!r}"
        text += f"  ({hint['why']})"
    _emit(as_json, payload, text)
    return EXIT_DENY


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Run untrusted plugins with exactly the capabilities their manifest declares.

    Exit codes: 0 allow/success, 1 deny (or a plugin refused / over budget), 2 invalid input
    or any other coded error, 3 internal error (or the output could not be written), 130
    interrupted (Ctrl-C), 141 the reader of the output went away (broken pipe).
    """
    ctx.obj = {"debug": debug}


_KINDS: Final = ("fs", "fetch", "db", "secret", "publish", "subscribe")


@cli.command(name="check")
@click.option("--manifest", "manifest", required=True, type=click.Path(dir_okay=False))
@click.option("--root", default=".", show_default=True, help="Root the fs rules are relative to.")
@click.option("--mode", default="read", type=click.Choice(["read", "write"]))
@click.option("--sql", default=None, help="SQL text for `db`.")
@click.option("--dialect", default="sqlite", type=click.Choice(["sqlite", "postgres"]))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("kind", type=click.Choice(_KINDS))
@click.argument("value", required=False)
def check(  # noqa: PLR0917 — click passes options positionally
    manifest: str,
    root: str,
    mode: str,
    sql: str | None,
    dialect: str,
    as_json: bool,
    kind: str,
    value: str | None,
) -> None:
    """Print the decision, reason and matching rule for one request.

    KIND is fs PATH, fetch URL, db --sql TEXT (or db TABLE), secret NAME, publish TOPIC or
    subscribe TOPIC.
    """
    try:
        if kind == "db":
            if (sql is None) == (value is None):
                raise click.UsageError("db takes either --sql TEXT or a TABLE name")
            payload: dict[str, Any] = {"sql": sql, "params": []} if sql else {"table": value}
            capability = "db"
        else:
            if value is None:
                raise click.UsageError(f"{kind} needs a value")
            capability, payload = {
                "fs": ("fs", {"path": value, "mode": mode}),
                "fetch": ("fetch", {"url": value}),
                "secret": ("secrets", {"name": value}),
                "publish": ("events", {"action": "publish", "topic": value}),
                "subscribe": ("events", {"action": "subscribe", "topic": value}),
            }[kind]
        decision, hint = _decide(manifest, root, capability, payload, dialect)
    except SuaveplanError as exc:
        sys.exit(_fail(as_json, exc))
    sys.exit(_report(as_json, capability, decision, hint))


cli.add_command(check, name="explain")


# Second-level labels under which registrations are public (`*.co.uk` is as broad as `*.com`).
_PUBLIC_SLDS: Final = frozenset({"ac", "co", "com", "edu", "gov", "ne", "net", "or", "org"})


def _broad_suffix(suffix: str) -> bool:
    labels = suffix.split(".")
    if len(labels) == 1:
        return True
    return len(labels) == 2 and labels[0] in _PUBLIC_SLDS and len(labels[1]) == 2


def _rule_host(rule: str) -> str:
    """The host of a fetch rule without `http:`, port or IPv6 brackets."""
    host = rule.removeprefix("http:")
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _private_ip(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_unspecified


def manifest_warnings(path: str) -> list[dict[str, str]]:
    """Over-broad grants worth a second look (the manifest is still valid).

    Each warning is `{"path": field path, "rule": the rule, "message": why}`. An empty or
    missing `database.tablePrefix` is not a warning but an error: the manifest refuses it.
    """
    m = load_manifest(path)
    warnings: list[dict[str, str]] = []

    def warn(field: str, rule: str, message: str) -> None:
        warnings.append({"path": field, "rule": rule, "message": message})

    for i, rule in enumerate(m.permissions.fs):
        body = rule.removeprefix("rw:").removeprefix("./").removeprefix("/")
        if set(body) <= {"*", "/"}:
            warn(f"permissions.fs[{i}]", rule, "grants the whole plugin root")
        elif body.startswith("*"):
            warn(f"permissions.fs[{i}]", rule, "matches files anywhere beneath the plugin root")
    for i, rule in enumerate(m.permissions.fetch):
        host = _rule_host(rule)
        if host.startswith("*.") and _broad_suffix(host[2:]):
            warn(f"permissions.fetch[{i}]", rule, "grants every host under a public suffix")
        if rule.startswith("http:"):
            warn(f"permissions.fetch[{i}]", rule, "allows unencrypted http")
        if _private_ip(host):
            warn(
                f"permissions.fetch[{i}]",
                rule,
                "names a private or loopback address (the fetch adapter allows an IP literal "
                "its rule names, so this reaches the host's network)",
            )
    for name, rules in (("publishes", m.events.publishes), ("subscribes", m.events.subscribes)):
        for i, rule in enumerate(rules):
            if set(rule) <= {"*", "."}:
                warn(f"events.{name}[{i}]", rule, "grants every topic")
    return warnings


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.argument("manifest", type=click.Path(dir_okay=False))
def validate(as_json: bool, manifest: str) -> None:
    """Validate MANIFEST: precise errors with field paths, warnings for broad grants."""
    try:
        warnings = manifest_warnings(manifest)
    except SuaveplanError as exc:
        if not as_json:
            errors = exc.details.get("errors", [])
            for problem in errors if isinstance(errors, list) else []:
                if isinstance(problem, dict):
                    where = f"{problem.get('path')}: " if problem.get("path") else ""
                    click.echo(printable(f"  {where}{problem.get('message')}"), err=True)
        sys.exit(_fail(as_json, exc))
    _emit(
        as_json,
        {"valid": True, "warnings": warnings},
        "\n".join(
            ["valid", *(f"warning: {w['path']}: {w['rule']!r} {w['message']}" for w in warnings)]
        ),
    )
    sys.exit(EXIT_ALLOW)


@cli.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON document: each example's decisions and what its run did.",
)
@click.argument("examples", type=click.Path(file_okay=False, exists=True), default="examples")
def demo(as_json: bool, examples: str) -> None:
    """Explain what each example manifest allows and refuses, and run the example plugins."""
    from suaveplan_sandbox.cli._demo import run_demo

    sys.exit(run_demo(Path(examples), as_json=as_json))


@cli.command(name="run")
@click.argument("plugin", type=click.Path(exists=True))
@click.option("--manifest", "manifest", required=True, type=click.Path(dir_okay=False))
@click.option("--root", default=None, help="Root for fs rules (default: the manifest's folder).")
@click.option("--call", "call", default=None, help="Function (Python) or export (WASM) to call.")
@click.option("--args", "args_json", default="[]", help="JSON list of arguments.")
@click.option("--argv", "argv", multiple=True, help="argv for a WASM command module (repeat).")
@click.option("--trace", is_flag=True, help="Print every capability decision as it happens.")
@click.option(
    "--data-dir",
    "data_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Where the plugin's SQLite database lives (DIR/NAME.sqlite3; default: a temp dir).",
)
@click.option(
    "--secret",
    "secret_names",
    multiple=True,
    help="Give the plugin secret NAME from the environment variable NAME (repeat).",
)
@click.option("--json", "as_json", is_flag=True)
def run_command(  # noqa: PLR0917 — click passes options positionally
    plugin: str,
    manifest: str,
    root: str | None,
    call: str | None,
    args_json: str,
    argv: tuple[str, ...],
    trace: bool,
    data_dir: str | None,
    secret_names: tuple[str, ...],
    as_json: bool,
) -> None:
    """Run PLUGIN (a .py file, package folder or .wasm module) under --manifest.

    Prints the result as JSON. A WASM module without --call runs as a command (_start).
    """
    import asyncio

    from suaveplan_sandbox.cli._demo_runs import plain
    from suaveplan_sandbox.cli._run import run_plugin

    try:
        args = json.loads(args_json, parse_constant=_not_json)
    except ValueError as exc:
        raise click.UsageError(f"--args is not JSON: {exc}"[:300]) from None
    except RecursionError:  # `[[[[…`: the parser recurses per level
        raise click.UsageError("--args is not JSON: nested too deeply") from None
    if not isinstance(args, list):
        raise click.UsageError("--args is a JSON list")
    try:
        result = asyncio.run(
            run_plugin(
                Path(plugin),
                Path(manifest),
                root=Path(root) if root else None,
                call=call,
                args=args,
                argv=list(argv),
                trace=trace,
                as_json=as_json,
                data_dir=Path(data_dir) if data_dir else None,
                secret_names=secret_names,
            )
        )
    except SuaveplanError as exc:
        _show_traceback(exc)
        if as_json:
            click.echo(json.dumps({"error": exc.to_wire()}, sort_keys=True))
        else:
            # The manifest's message already says where (file or field paths) and why.
            shown = exc.details and exc.code != "SAND_MANIFEST_INVALID"
            extra = f" {json.dumps(exc.details)}" if shown else ""
            click.echo(printable(f"error {exc.code}: {exc.message}{extra}"), err=True)
        sys.exit(EXIT_DENY if exc.code in _REFUSALS else EXIT_INVALID)
    click.echo(json.dumps({"result": plain(result)} if as_json else plain(result)))
    sys.exit(EXIT_ALLOW)


def _not_json(constant: str) -> object:
    """`--args` is JSON: Python's `NaN`, `Infinity` and `-Infinity` extensions are not."""
    raise ValueError(f"{constant} is not a JSON value")


_REFUSALS: Final = frozenset(
    {"SAND_PERM_DENIED", "BUDGET_EXCEEDED", "SAND_WASM_OUTBOUND_DENIED", "SAND_WASM_PREOPEN_DENIED"}
)


@cli.command()
@click.option("--host", "host", default=None, help="MODULE:OBJECT with your factories.")
@click.option("--json", "as_json", is_flag=True)
def conformance(host: str | None, as_json: bool) -> None:
    """Run the permissions, VM and WASM conformance harnesses (exit 1 if any scenario fails)."""
    from rich.console import Console

    from suaveplan_sandbox.cli._conformance import FACTORY_NAMES, load_host, run_conformance

    console = Console(stderr=as_json)
    try:
        factories = load_host(host)
    except Exception as exc:  # the host's own module may raise anything while importing
        raise click.UsageError(f"--host: {type(exc).__name__}: {exc}"[:500]) from None
    if not factories:
        # Nothing to check is not a pass: a typo'd OBJECT must not exit 0.
        raise click.UsageError(f"--host {host} provides none of {', '.join(FACTORY_NAMES)}")
    results = run_conformance(factories, console)
    if as_json:
        click.echo(
            json.dumps(
                {
                    name: {
                        "provided": r.provided,
                        "passed": r.passed,
                        "failed": [{"scenario": n, "why": w} for n, w in r.failed],
                    }
                    for name, r in results.items()
                },
                sort_keys=True,
            )
        )
    sys.exit(EXIT_DENY if any(r.failed for r in results.values()) else EXIT_ALLOW)


@cli.command()
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if a page is out of date.")
@click.option("--json", "as_json", is_flag=True)
@click.argument("docs", type=click.Path(file_okay=False), default="docs")
def reference(check: bool, as_json: bool, docs: str) -> None:
    """Regenerate the error-code and metrics reference pages under DOCS."""
    from suaveplan_sandbox.cli._reference import stale_reference, write_reference

    if check:
        stale = [str(p) for p in stale_reference(Path(docs))]
        _emit(
            as_json,
            {"stale": stale},
            "\n".join(f"out of date: {p}" for p in stale) or "reference pages are up to date",
        )
        sys.exit(EXIT_DENY if stale else EXIT_ALLOW)
    written = [str(p) for p in write_reference(Path(docs))]
    _emit(as_json, {"written": written}, "\n".join(f"wrote {p}" for p in written))
    sys.exit(EXIT_ALLOW)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code instead of raising for scripted use."""
    args = list(argv if argv is not None else sys.argv[1:])
    try:
        return _main(args)
    except KeyboardInterrupt:  # a second Ctrl-C, while the first was being reported
        return _interrupted()
    except OSError as exc:  # reporting an error failed too: the output cannot be written
        if "--debug" in args:  # `_main` re-raised an internal error as it is
            raise
        return _output_failed(exc)


def _interrupted() -> int:
    """Ctrl-C: the sandbox and its worker were disposed on the way out; no traceback."""
    with contextlib.suppress(Exception):
        click.echo("interrupted", err=True)
    return EXIT_INTERRUPTED


def _output_failed(exc: OSError) -> int:
    """stdout is gone (EPIPE) or failing (ENOSPC, EIO). Later writes, and the flush at exit,
    go to /dev/null so Python does not report the same failure again as it exits."""
    with contextlib.suppress(Exception):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    if exc.errno == errno.EPIPE:
        return EXIT_BROKEN_PIPE
    with contextlib.suppress(Exception):
        click.echo(printable(f"internal error: cannot write the output ({exc})"), err=True)
    return EXIT_INTERNAL


def _main(args: list[str]) -> int:
    as_json = "--json" in args
    stdout = sys.stdout
    try:
        cli.main(args=args, standalone_mode=False)
    except SystemExit as exc:
        if sys.stdout is not stdout:
            # click swaps stdout for a wrapper (and exits 1, our "deny") only on EPIPE.
            return EXIT_BROKEN_PIPE
        return int(exc.code or 0)
    except click.ClickException as exc:
        if as_json:
            error = {"code": "SAND_INVALID_ARGUMENT", "message": exc.format_message()}
            click.echo(json.dumps({"error": {**error, "details": {}}}, sort_keys=True))
        else:
            exc.show()
        return EXIT_INVALID
    except click.Abort as exc:
        # click turns KeyboardInterrupt (Ctrl-C) into Abort, after one blank stderr line.
        if isinstance(exc.__cause__, KeyboardInterrupt):
            return _interrupted()
        return EXIT_INVALID
    except Exception as exc:
        if "--debug" in args:
            raise
        if as_json:
            crash = {"type": type(exc).__name__, "message": str(exc)}
            click.echo(json.dumps({"internal_error": crash}, sort_keys=True))
        line = f"internal error: {type(exc).__name__}: {exc} (rerun with --debug)"
        click.echo(printable(line), err=True)
        return EXIT_INTERNAL
    return EXIT_ALLOW
