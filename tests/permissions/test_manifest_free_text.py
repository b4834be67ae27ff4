"""The manifest's free-text fields hold no control characters.

`version` and `description` are the only manifest strings without a pattern or a rule
grammar. Before, they took any character: a NUL in `version` reached the migrations record
(PostgreSQL `text` cannot hold one, so applying migrations failed there), and an ESC sequence
in either reached an operator's logs and terminal. Now a control character (Unicode category
Cc: C0, DEL, C1) is `SAND_MANIFEST_INVALID` naming the field and the code point, never the
character; a description may still hold tabs and line breaks.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import load_manifest

CONTROLS = [chr(c) for c in [*range(0x00, 0x20), *range(0x7F, 0xA0)]]
TEXT_BREAKS = ["\t", "\n", "\r"]


def _problem(field: str, value: str) -> dict[str, Any]:
    with pytest.raises(SuaveplanError) as info:
        load_manifest({"name": "p", field: value})
    err = info.value
    assert err.code == "SAND_MANIFEST_INVALID"
    wire = json.dumps(err.to_wire())
    for control in CONTROLS:
        assert control not in str(err)
        assert control not in wire
    return cast(list[dict[str, Any]], err.details["errors"])[0]


def test_every_control_code_point_is_category_cc() -> None:
    # The two patterns are written as ranges: pin that they are exactly Unicode's Cc.
    everything = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    assert [c for c in everything if unicodedata.category(c) == "Cc"] == CONTROLS


@pytest.mark.parametrize("control", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
def test_a_control_character_in_the_version_is_refused(control: str) -> None:
    problem = _problem("version", f"1.0{control}")
    assert problem["path"] == "version"
    assert f"U+{ord(control):04X}" in problem["message"]


@pytest.mark.parametrize(
    "control",
    [c for c in CONTROLS if c not in TEXT_BREAKS],
    ids=[f"U+{ord(c):04X}" for c in CONTROLS if c not in TEXT_BREAKS],
)
def test_a_control_character_other_than_a_text_break_in_the_description_is_refused(
    control: str,
) -> None:
    problem = _problem("description", f"a plugin{control}\x1b[2J")
    assert problem["path"] == "description"
    assert f"U+{ord(control):04X}" in problem["message"]


def test_a_description_keeps_its_tabs_and_line_breaks() -> None:
    text = "first line\r\nsecond\tcolumn\nthird"
    assert load_manifest({"name": "p", "description": text}).description == text


def test_a_version_with_a_line_break_is_refused() -> None:
    assert _problem("version", "1.0\n2.0")["path"] == "version"


@given(st.text(alphabet=st.characters(exclude_categories=["Cc", "Cs"])))
def test_printable_text_of_any_script_is_kept_in_both_fields(text: str) -> None:
    manifest = load_manifest({"name": "p", "version": text, "description": text})
    assert (manifest.version, manifest.description) == (text, text)


def test_a_megabyte_description_is_judged_in_one_linear_scan() -> None:
    text = "x" * (900 * 1024) + "\x00"
    assert _problem("description", text)["path"] == "description"
