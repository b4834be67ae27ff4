"""SuaveplanError: registered codes, and a wire form that survives msgpack and JSON."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from suaveplan_sandbox.errors import (
    CODES,
    SuaveplanError,
    define_codes,
    error_from_wire,
    is_registered,
    registered_codes,
)


def _chain(exc: BaseException | None) -> list[tuple[str, str, object]]:
    out: list[tuple[str, str, object]] = []
    while exc is not None:
        assert isinstance(exc, SuaveplanError)
        out.append((exc.code, exc.message, exc.details))
        exc = exc.__cause__
    return out


def test_unregistered_codes_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="unregistered"):
        SuaveplanError("NOT_A_CODE", "x")


def test_required_codes_are_registered() -> None:
    for code in (
        "SAND_PERM_DENIED",
        "BUDGET_EXCEEDED",
        "SAND_MANIFEST_INVALID",
        "SAND_VM_EVAL_REJECTED",
        "SAND_VM_INDIRECT_EVAL_REJECTED",
        "SAND_VM_DISPOSED",
        "SAND_WASM_WASI_VERSION_UNSUPPORTED",
        "SAND_WASM_OUTBOUND_DENIED",
    ):
        assert is_registered(code)
        assert code in CODES
    assert set(CODES) <= set(registered_codes())


def test_define_codes_lets_users_pin_their_own_codes() -> None:
    mine = define_codes("tests.errors", {"APP_TEST_CODE": "a code defined by a host app"})
    assert "APP_TEST_CODE" in mine
    err = SuaveplanError("APP_TEST_CODE", "hello")
    assert SuaveplanError.from_wire(err.to_wire()).code == "APP_TEST_CODE"


def test_define_codes_refuses_to_redefine_a_code_with_another_meaning() -> None:
    with pytest.raises(ValueError):
        define_codes("someone.else", {"SAND_PERM_DENIED": "something different"})


def test_cause_chain_round_trips_through_msgpack_and_json() -> None:
    root = SuaveplanError("SAND_FS_NOT_FOUND", "no such file", {"n": 1})
    mid = SuaveplanError("SAND_ADAPTER_FAILED", "adapter failed", {"capability": "fs"}, cause=root)
    top = SuaveplanError("SAND_VM_PLUGIN_ERROR", "plugin raised", {"type": "KeyError"}, cause=mid)
    wire = top.to_wire()
    via_msgpack = SuaveplanError.from_wire(msgpack.unpackb(msgpack.packb(wire), raw=False))
    via_json = error_from_wire(json.loads(json.dumps(wire)))
    assert _chain(via_msgpack) == _chain(top)
    assert _chain(via_json) == _chain(top)


def test_unknown_code_from_the_wire_stays_a_coded_error() -> None:
    err = SuaveplanError.from_wire({"code": "os.system", "message": "x", "details": {}})
    assert type(err) is SuaveplanError
    assert err.code == "SAND_UNKNOWN_ERROR"
    assert err.details["original_code"] == "os.system"


@pytest.mark.parametrize(
    "data",
    [
        None,
        1,
        "x",
        [],
        {"code": 1, "message": "m"},
        {"code": "SAND_PERM_DENIED"},
        {"code": "SAND_PERM_DENIED", "message": "m", "details": []},
    ],
)
def test_malformed_wire_errors_become_wire_errors(data: object) -> None:
    assert SuaveplanError.from_wire(data).code == "SAND_WIRE_ERROR"


def test_a_deep_cause_chain_from_the_wire_is_cut() -> None:
    data: dict[str, object] = {"code": "SAND_WIRE_ERROR", "message": "leaf", "details": {}}
    for _ in range(10_000):
        data = {"code": "SAND_WIRE_ERROR", "message": "m", "details": {}, "cause": data}
    assert len(_chain(SuaveplanError.from_wire(data))) <= 16


def test_non_suaveplan_causes_cross_as_unknown_errors_without_their_message() -> None:
    err = SuaveplanError("SAND_ADAPTER_FAILED", "failed", cause=OSError("/etc/shadow denied"))
    wire = err.to_wire()
    assert "/etc/shadow" not in json.dumps(wire)
    rebuilt = SuaveplanError.from_wire(wire)
    assert isinstance(rebuilt.cause, SuaveplanError)
    assert rebuilt.cause.code == "SAND_UNKNOWN_ERROR"


_plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**62), 2**62) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@given(details=st.dictionaries(st.text(max_size=8), _plain, max_size=5), message=st.text())
def test_any_plain_details_round_trip(details: dict[str, object], message: str) -> None:
    err = SuaveplanError("SAND_DB_ERROR", message[:4096], details)  # type: ignore[arg-type]
    back = SuaveplanError.from_wire(msgpack.unpackb(msgpack.packb(err.to_wire()), raw=False))
    assert (back.code, back.message, back.details) == (err.code, err.message, err.details)


@given(
    st.recursive(
        _plain,
        lambda c: st.lists(c) | st.dictionaries(_plain.filter(lambda x: isinstance(x, str)), c),
        max_leaves=20,
    )
)
def test_from_wire_never_raises(data: object) -> None:
    assert isinstance(SuaveplanError.from_wire(data), SuaveplanError)
