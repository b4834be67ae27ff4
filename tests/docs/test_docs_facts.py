"""Lists the docs spell out by hand match the code they describe (deny reasons, capabilities,
hardening layers, the ASGI example's status table)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from suaveplan_sandbox.permissions import CAPABILITIES, DenyReason
from suaveplan_sandbox.vm._hardening._apply import LAYERS

DOCS = Path(__file__).resolve().parents[2] / "docs"
APP = DOCS.parent / "examples" / "asgi_host" / "app.py"
_TICKED = re.compile(r"`([^`]+)`")


def _paragraph(page: str, start: str) -> str:
    text = (DOCS / page).read_text(encoding="utf-8")
    at = text.index(start)
    end = text.find("\n\n", at)
    return text[at : end if end != -1 else None]


def test_concepts_lists_every_deny_reason_and_nothing_else() -> None:
    listed = _TICKED.findall(
        _paragraph("concepts.md", "`suaveplan_sandbox.permissions.Deny` (with")
    )
    reasons = [t for t in listed if re.fullmatch(r"[a-z]+(?:-[a-z]+)+", t)]
    assert reasons == [r.value for r in DenyReason]


def test_concepts_lists_the_capabilities() -> None:
    text = _paragraph("concepts.md", "`suaveplan_sandbox.permissions.CAPABILITIES`")
    assert tuple(_TICKED.findall(text.split("CAPABILITIES`", 1)[1])) == CAPABILITIES


def test_the_host_guide_names_every_hardening_layer() -> None:
    text = _paragraph("hosts.md", "`sb.hardening` is a report")
    layers = [t for t in _TICKED.findall(text.split("Layers are", 1)[1]) if t in LAYERS]
    assert tuple(layers) == LAYERS


def _asgi_app() -> ModuleType:
    spec = importlib.util.spec_from_file_location("asgi_host_app", APP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_host_guide_status_table_matches_the_asgi_example() -> None:
    status_by_code = _asgi_app().STATUS_BY_CODE
    table = (DOCS / "hosts.md").read_text(encoding="utf-8").split("| status | when |", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    documented: dict[str, int] = {}
    for row in rows:
        cell_status, _when, codes = (cell.strip() for cell in row.strip("|").split("|"))
        for code in _TICKED.findall(codes):
            documented[code] = int(cell_status)
    for code, expected in documented.items():
        actual = status_by_code.get(code, 422)  # anything unlisted is the plugin's fault: 422
        assert actual == expected, (
            f"{code}: the guide says {expected}, the example answers {actual}"
        )
    undocumented = set(status_by_code) - set(documented)
    assert not undocumented, f"codes with a status the guide does not list: {undocumented}"
