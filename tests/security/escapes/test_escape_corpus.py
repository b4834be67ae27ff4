"""Escape corpus: each plugin under `plugins/` tries one technique inside a real VM sandbox.

Two runs of the whole corpus:

* **both layers** (production): every case must end contained: a `SuaveplanError` coded
  `SAND_*` or `BUDGET_EXCEEDED` (at create or at call), or a harmless return value; the
  canaries must hold: a secret file outside the policy root, a secret host environment
  variable, a path the plugin must not create, and the fork server the worker came from;
  and no plugin may print the escape marker, which the ones that reach forbidden objects
  print before touching the OS.
* **process layer only**: the same plugins with the in-interpreter layer switched off for the
  plugin (no AST policy, the real builtins and `__import__`, no facades) while every
  process-layer protection stays on. The fork server prepares the interpreter once for all
  its workers, so shared classes are still sealed and the worker-only standard-library
  guards (copy, dataclasses) still installed; an escaped guest that undid those would gain
  nothing the real builtins do not already give it here. This is what a guest that fully escaped the
  interpreter layer holds. The marker may appear (that is the point); the OS canaries
  must still hold for every technique.

The switch is `load_plugin(..., _without_interpreter_layer=True)`, a private argument that
nothing but this harness passes (here by rebinding the name `create_vm_sandbox` looks up);
the worker logs a warning when it runs that way, and the run asserts the warning so a
silently checked bundle cannot pass for a process-only run.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import _sandbox as vm_sandbox_module
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._guest import PluginBundle, load_plugin
from suaveplan_sandbox.vm._zygote import fork_server

PLUGINS = Path(__file__).parent / "plugins"
CASES = sorted(p for p in PLUGINS.glob("*.py") if not p.name.startswith("_"))
ENV_NAME = "SUAVEPLAN_ESCAPE_CANARY"
# A plugin that reaches something it must not (e.g. the real builtins) prints this marker.
ESCAPE_MARKER = "SANDBOX-" + "ESCAPED"
LAYER_OFF_WARNING = "in-interpreter layer OFF"
FAMILIES = (
    "class",
    "ctypes",
    "dyncode",
    "format",
    "gc",
    "import",
    "introspect",
    "match",
    "mutate",
    "pickle",
    "process",
    "resource",
    "signal",
    "thread",
    "unicode",
    "weakref",
    "wire",
)
MIN_PER_FAMILY = 4
ADVISORY = re.compile(r"^# Advisory: (?P<ids>.+?) \((?P<project>vm2|RestrictedPython)\b", re.M)
ADVISORY_ID = re.compile(r"\bCVE-\d{4}-\d{4,}\b")
# The published advisories of both projects that translate to a Python guest, and the ones
# that do not (JavaScript-only machinery with no Python counterpart), each with why.
ADVISORIES_TRANSLATED = {
    "vm2": {
        "CVE-2019-10761",
        "CVE-2022-36067",
        "CVE-2023-29017",
        "CVE-2023-29199",
        "CVE-2023-30547",
        "CVE-2023-32314",
        "CVE-2023-37466",
        "CVE-2023-37903",
    },
    "RestrictedPython": {
        "CVE-2023-37271",
        "CVE-2023-41039",
        "CVE-2024-47532",
        "CVE-2025-22153",
        "CVE-2026-55830",
    },
}


def _family(plugin: Path) -> str:
    return plugin.stem.split("_", 1)[0]


def test_corpus_is_not_empty() -> None:
    assert len(CASES) >= 80


def test_every_case_belongs_to_a_known_family_and_each_family_is_not_thin() -> None:
    counts = {family: 0 for family in FAMILIES}
    for plugin in CASES:
        assert _family(plugin) in counts, plugin.name
        counts[_family(plugin)] += 1
    thin = {family: n for family, n in counts.items() if n < MIN_PER_FAMILY}
    assert not thin, thin


def test_every_case_names_its_technique() -> None:
    for plugin in CASES:
        assert "# Technique:" in plugin.read_text(), plugin.name


def corpus_advisories() -> dict[str, dict[str, list[str]]]:
    """project -> advisory id -> corpus cases whose header names it."""
    out: dict[str, dict[str, list[str]]] = {"vm2": {}, "RestrictedPython": {}}
    for plugin in CASES:
        for match in ADVISORY.finditer(plugin.read_text()):
            for advisory in ADVISORY_ID.findall(match["ids"]):
                out[match["project"]].setdefault(advisory, []).append(plugin.stem)
    return out


def test_corpus_lists_the_advisories_it_translates() -> None:
    # A reader checks coverage here: each published advisory that applies to Python is
    # named in the header of at least one case (`# Advisory: CVE-… (vm2 …)`).
    covered = corpus_advisories()
    for project, wanted in ADVISORIES_TRANSLATED.items():
        missing = wanted - set(covered[project])
        assert not missing, (project, sorted(missing))
        unexpected = set(covered[project]) - wanted
        assert not unexpected, (project, sorted(unexpected))


def _contained_code(code: str) -> bool:
    return code.startswith("SAND_") or code == "BUDGET_EXCEEDED"


@dataclass(frozen=True, slots=True)
class _Outcome:
    text: str
    codes_ok: bool
    file_secret_leaked: bool
    env_secret_leaked: bool
    forbidden_created: bool
    fork_server_survived: bool
    marker_printed: bool
    created: bool
    layer_off_logged: bool
    bundles_unchecked: bool

    @property
    def os_contained(self) -> bool:
        return (
            self.codes_ok
            and not self.file_secret_leaked
            and not self.env_secret_leaked
            and not self.forbidden_created
            and self.fork_server_survived
        )


async def _run_case(
    plugin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, interpreter_layer: bool
) -> _Outcome:
    file_secret = "FILECANARY-" + secrets.token_hex(8)
    env_secret = "ENVCANARY-" + secrets.token_hex(8)
    secret_file = tmp_path / "outside" / "secret.txt"
    secret_file.parent.mkdir()
    secret_file.write_text(file_secret)
    forbidden = tmp_path / "outside" / "pwned"
    monkeypatch.setenv(ENV_NAME, env_secret)
    bundles: list[PluginBundle] = []
    if not interpreter_layer:

        def unchecked(path: str | Path) -> PluginBundle:
            bundles.append(load_plugin(path, _without_interpreter_layer=True))
            return bundles[-1]

        monkeypatch.setattr(vm_sandbox_module, "load_plugin", unchecked)

    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "data" / "ok.txt").write_text("fine")
    target = root / "plugin.py"
    target.write_text(plugin.read_text())
    manifest: dict[str, object] = {
        "name": "escape",
        "version": "1.0.0",
        "permissions": {
            "fs": ["./data/*"],
            "budgets": {"wallClockMs": 2000, "memoryMb": 256},
        },
    }
    policy = PermissionPolicy.from_manifest(manifest, root=root)
    zygote = fork_server().ping()

    outcome: list[str] = []
    codes_ok = True
    created = False
    logs: list[tuple[str, str]] = []
    try:
        sb = await create_vm_sandbox(plugin_module_path=str(target), policy=policy)
    except SuaveplanError as err:
        codes_ok = _contained_code(err.code)
        outcome.append(repr((err.code, err.message, err.details)))
    else:
        created = True
        try:
            try:
                result = await sb.call("attack", str(secret_file), str(forbidden))
            except SuaveplanError as err:
                codes_ok = _contained_code(err.code)
                outcome.append(repr((err.code, err.message, err.details)))
            else:
                outcome.append(repr(result))
            logs = list(sb.logs)
            outcome.extend(repr(entry) for entry in logs)
            outcome.extend(repr(deny) for deny in sb.denials)
        finally:
            await sb.dispose()

    text = "\n".join(outcome)
    return _Outcome(
        text=text,
        codes_ok=codes_ok,
        file_secret_leaked=file_secret in text,
        env_secret_leaked=env_secret in text,
        forbidden_created=forbidden.exists(),
        fork_server_survived=fork_server().ping() == zygote,
        marker_printed=ESCAPE_MARKER in text,
        created=created,
        layer_off_logged=any(LAYER_OFF_WARNING in line for _, line in logs),
        bundles_unchecked=bool(bundles) and not any(b.interpreter_layer for b in bundles),
    )


def _assert_os_canaries(out: _Outcome) -> None:
    assert out.codes_ok, out.text
    assert not out.file_secret_leaked, out.text
    assert not out.env_secret_leaked, out.text
    assert not out.forbidden_created, out.text
    assert out.fork_server_survived, out.text


@pytest.mark.parametrize("plugin", CASES, ids=[p.stem for p in CASES])
async def test_escape_is_contained(
    plugin: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    security_record: Callable[..., None],
) -> None:
    out = await _run_case(plugin, tmp_path, monkeypatch, interpreter_layer=True)
    contained = out.os_contained and not out.marker_printed and not out.layer_off_logged
    security_record(
        "escapes",
        family=_family(plugin),
        technique=plugin.stem,
        layer="both",
        contained=contained,
    )
    _assert_os_canaries(out)
    assert not out.marker_printed, out.text
    assert not out.layer_off_logged, out.text


@pytest.mark.parametrize("plugin", CASES, ids=[p.stem for p in CASES])
async def test_escape_is_contained_by_the_process_layer_alone(
    plugin: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    security_record: Callable[..., None],
) -> None:
    out = await _run_case(plugin, tmp_path, monkeypatch, interpreter_layer=False)
    # The worker really ran unchecked code: the bundle was built without the checks, and
    # (whenever the sandbox came up) the worker said so in its log.
    ran = out.bundles_unchecked and (out.layer_off_logged or not out.created)
    security_record(
        "escapes",
        family=_family(plugin),
        technique=plugin.stem,
        layer="process-only",
        contained=out.os_contained and ran,
    )
    assert ran, out.text
    _assert_os_canaries(out)
