"""Load-time policy: binding forms that are not Name nodes, and format specs with fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._guest import GuestRuntime, compile_bundle, load_plugin


def _load_code(tmp_path: Path, source: str) -> str | None:
    (tmp_path / "p.py").write_text(source)
    try:
        load_plugin(tmp_path / "p.py")
    except SuaveplanError as err:
        return err.code
    return None


@pytest.mark.parametrize(
    "source",
    [
        "def f():\n    try:\n        1\n    except Exception as __sp_format__:\n        pass\n",
        "def f(x):\n    match x:\n        case [*__sp_direct_eval__]:\n            pass\n",
        "def f(x):\n    match x:\n        case {**__builtins__}:\n            pass\n",
        "match 'enum':\n    case __name__:\n        pass\n",
        "def f(x):\n    match x:\n        case int() as __name__:\n            pass\n",
        "def f():\n    global __builtins__\n",
        "def f():\n    x = 1\n    def g():\n        nonlocal __x__\n",
    ],
)
def test_binding_a_dunder_through_any_binding_form_is_rejected(tmp_path: Path, source: str) -> None:
    assert _load_code(tmp_path, source) == "SAND_VM_ATTRIBUTE_FORBIDDEN"


def test_ordinary_binding_forms_still_load(tmp_path: Path) -> None:
    source = (
        "def f(x):\n"
        "    match x:\n"
        "        case [a, *rest]:\n"
        "            return a, rest\n"
        "        case {'k': v, **others}:\n"
        "            return v, others\n"
        "        case int() as n:\n"
        "            return n\n"
        "    try:\n"
        "        return int('x')\n"
        "    except ValueError as err:\n"
        "        return str(err)\n"
    )
    assert _load_code(tmp_path, source) is None


@pytest.mark.parametrize(
    "template", ["{0:{1.__globals__}}", "{0:>{1._x}}", "{0:{1:{2.__class__}}}"]
)
def test_a_field_nested_in_a_format_spec_is_checked_at_load(tmp_path: Path, template: str) -> None:
    assert _load_code(tmp_path, f"def f(a, b):\n    return {template!r}.format(a, b)\n") == (
        "SAND_VM_ATTRIBUTE_FORBIDDEN"
    )


def test_a_field_nested_in_a_format_spec_is_checked_at_runtime(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text(
        "def f(a, b):\n"
        "    t = '{0:{1.' + '_' * 2 + 'class' + '_' * 2 + '}}'\n"
        "    return t.format(a, b)\n"
        "def ok(w):\n"
        "    return '{0:>{1}}'.format('x', w)\n"
    )
    rt = GuestRuntime(
        compile_bundle(load_plugin(tmp_path / "p.py")),
        host_call=lambda c, o, a: None,
        log=lambda lv, t: None,
    )
    rt.start()
    with pytest.raises(SuaveplanError) as info:
        rt.call("f", [1, 2], {})
    assert info.value.code == "SAND_VM_ATTRIBUTE_FORBIDDEN"
    assert rt.call("ok", [3], {}) == "  x"
