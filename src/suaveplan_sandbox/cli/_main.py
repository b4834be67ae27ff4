"""`suaveplan-sandbox`: check and explain decisions, validate manifests, run the demo.

Exit codes (documented in the README and `--help`): 0 allow / success, 1 deny, 2 invalid
input (bad manifest, bad arguments), 3 internal error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

import click

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

_BROAD_FS: Final = frozenset({"*", "./*", "rw:*", "rw:./*", "/*"})


def _emit(as_json: bool, payload: dict[str, Any], text: str) -> None:
    click.echo(json.dumps(payload, sort_keys=True) if as_json else text)


def _fail(as_json: bool, exc: SuaveplanError) -> int:
    if as_json:
        click.echo(json.dumps({"error": exc.to_wire()}, sort_keys=True))
    else:
        click.echo(f"error {exc.code}: {exc.message}", err=True)
    return EXIT_INVALID


def _decide(
    manifest: str, root: str, capability: str, payload: dict[str, Any], dialect: str
) -> Allow | Deny:
    policy = PermissionPolicy.from_manifest(
        manifest,
        root=root,
        sql_dialect="postgres" if dialect == "postgres" else "sqlite",
    )
    checker = PermissionChecker(policy)
    if capability == "fs":
        return checker.check_fs(payload["path"], payload["mode"])
    if capability == "fetch":
        return checker.check_fetch(payload["url"])
    return checker.check_capability(capability, payload)


def _report(as_json: bool, capability: str, decision: Allow | Deny) -> int:
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
    _emit(
        as_json,
        {"decision": "deny", "capability": capability, "reason": decision.reason.value},
        f"deny   {capability}  reason={decision.reason.value}",
    )
    return EXIT_DENY


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Run untrusted plugins with exactly the capabilities their manifest declares.

    Exit codes: 0 allow/success, 1 deny (or a plugin refused / over budget), 2 invalid input
    or any other coded error, 3 internal error.
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
        decision = _decide(manifest, root, capability, payload, dialect)
    except SuaveplanError as exc:
        sys.exit(_fail(as_json, exc))
    sys.exit(_report(as_json, capability, decision))


cli.add_command(check, name="explain")


def manifest_warnings(path: str) -> list[str]:
    """Over-broad grants worth a second look (the manifest is still valid)."""
    m = load_manifest(path)
    warnings: list[str] = []
    for i, rule in enumerate(m.permissions.fs):
        if rule in _BROAD_FS:
            warnings.append(f"permissions.fs[{i}]: {rule!r} grants the whole plugin root")
    for i, rule in enumerate(m.permissions.fetch):
        host = rule.removeprefix("http:")
        if host.startswith("*.") and host.count(".") == 1:
            warnings.append(f"permissions.fetch[{i}]: {rule!r} grants a whole top-level domain")
        if rule.startswith("http:"):
            warnings.append(f"permissions.fetch[{i}]: {rule!r} allows unencrypted http")
    for name, rules in (("publishes", m.events.publishes), ("subscribes", m.events.subscribes)):
        for i, rule in enumerate(rules):
            if rule == "*":
                warnings.append(f"events.{name}[{i}]: '*' grants every topic")
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
                    click.echo(f"  {problem.get('path')}: {problem.get('message')}", err=True)
        sys.exit(_fail(as_json, exc))
    _emit(
        as_json,
        {"valid": True, "warnings": warnings},
        "\n".join(["valid", *(f"warning: {w}" for w in warnings)]),
    )
    sys.exit(EXIT_ALLOW)


@cli.command()
@click.argument("examples", type=click.Path(file_okay=False, exists=True), default="examples")
def demo(examples: str) -> None:
    """Explain what each example manifest allows and refuses, and run the example plugins."""
    from suaveplan_sandbox.cli._demo import run_demo

    sys.exit(run_demo(Path(examples)))


def _plain_result(value: object) -> object:
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, list | tuple):
        return [_plain_result(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain_result(v) for k, v in value.items()}
    return value


@cli.command(name="run")
@click.argument("plugin", type=click.Path(exists=True))
@click.option("--manifest", "manifest", required=True, type=click.Path(dir_okay=False))
@click.option("--root", default=None, help="Root for fs rules (default: the manifest's folder).")
@click.option("--call", "call", default=None, help="Function (Python) or export (WASM) to call.")
@click.option("--args", "args_json", default="[]", help="JSON list of arguments.")
@click.option("--argv", "argv", multiple=True, help="argv for a WASM command module (repeat).")
@click.option("--trace", is_flag=True, help="Print every capability decision as it happens.")
@click.option("--json", "as_json", is_flag=True)
def run_command(  # noqa: PLR0917 — click passes options positionally
    plugin: str,
    manifest: str,
    root: str | None,
    call: str | None,
    args_json: str,
    argv: tuple[str, ...],
    trace: bool,
    as_json: bool,
) -> None:
    """Run PLUGIN (a .py file, package folder or .wasm module) under --manifest.

    Prints the result as JSON. A WASM module without --call runs as a command (_start).
    """
    import asyncio

    from suaveplan_sandbox.cli._run import run_plugin

    try:
        args = json.loads(args_json)
    except ValueError as exc:
        raise click.UsageError(f"--args is not JSON: {exc}") from None
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
            )
        )
    except SuaveplanError as exc:
        if as_json:
            click.echo(json.dumps({"error": exc.to_wire()}, sort_keys=True))
        else:
            click.echo(f"error {exc.code}: {exc.message} {json.dumps(exc.details)}", err=True)
        sys.exit(EXIT_DENY if exc.code in _REFUSALS else EXIT_INVALID)
    click.echo(json.dumps({"result": _plain_result(result)} if as_json else _plain_result(result)))
    sys.exit(EXIT_ALLOW)


_REFUSALS: Final = frozenset(
    {"SAND_PERM_DENIED", "BUDGET_EXCEEDED", "SAND_WASM_OUTBOUND_DENIED", "SAND_WASM_PREOPEN_DENIED"}
)


@cli.command()
@click.option("--host", "host", default=None, help="MODULE:OBJECT with your factories.")
@click.option("--json", "as_json", is_flag=True)
def conformance(host: str | None, as_json: bool) -> None:
    """Run the permissions, VM and WASM conformance harnesses (exit 1 if any scenario fails)."""
    from rich.console import Console

    from suaveplan_sandbox.cli._conformance import run_conformance

    console = Console(stderr=as_json)
    try:
        results = run_conformance(host, console)
    except (ImportError, AttributeError, ValueError) as exc:
        raise click.UsageError(f"--host: {exc}") from None
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
@click.argument("docs", type=click.Path(file_okay=False), default="docs")
def reference(docs: str) -> None:
    """Regenerate the error-code and metrics reference pages under DOCS."""
    from suaveplan_sandbox.cli._reference import write_reference

    for path in write_reference(Path(docs)):
        click.echo(f"wrote {path}")
    sys.exit(EXIT_ALLOW)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code instead of raising for scripted use."""
    try:
        cli.main(args=argv, standalone_mode=False)
    except SystemExit as exc:
        return int(exc.code or 0)
    except click.ClickException as exc:
        exc.show()
        return EXIT_INVALID
    except click.Abort:
        return EXIT_INVALID
    except Exception as exc:
        if "--debug" in (argv if argv is not None else sys.argv):
            raise
        click.echo(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug)", err=True)
        return EXIT_INTERNAL
    return EXIT_ALLOW
