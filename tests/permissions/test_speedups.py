"""The C matchers (`suaveplan_sandbox._speedups`) against the Python reference checks.

Every decision the C code makes must equal the pure-Python `check` of a separately built
rule set (separate, so neither sees the other's memo): on every vector, on generated rules
and inputs, on inputs at and past the fast path's bounds, and on inputs built to break a C
parser (NUL bytes, long runs of `..`, surrogates, huge inputs). Malformed tables and bad
arguments raise Python exceptions, never crash, and repeated checks leak no memory.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suaveplan_sandbox import _speedups
from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy, _accel
from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason
from suaveplan_sandbox.permissions._fetch_rules import FetchRuleError, FetchRuleSet
from suaveplan_sandbox.permissions._fs_rules import (
    _DENIALS,
    _DENY_INVALID,
    _DENY_MODE,
    _DENY_OUTSIDE,
    FsRuleError,
    FsRuleSet,
    normalize_request_path,
)

_VECTORS = Path(__file__).parent.parent / "vectors"
_PATHS: list[dict[str, Any]] = json.loads((_VECTORS / "paths.json").read_text("utf-8"))["cases"]
_URLS: list[dict[str, Any]] = json.loads((_VECTORS / "urls.json").read_text("utf-8"))["cases"]


_R = TypeVar("_R", FsRuleSet, FetchRuleSet)


def _pair(kind: type[_R], rules: list[str]) -> tuple[_R, _R]:
    """The same rules built twice: on the C matcher, and on the Python reference alone."""
    with _accel.accelerated():
        fast = kind(rules)
    with _accel.pure_python():
        slow = kind(rules)
    assert fast._matcher is not None
    assert slow._matcher is None
    return fast, slow


def _pair_fs(rules: list[str]) -> tuple[FsRuleSet, FsRuleSet]:
    return _pair(FsRuleSet, rules)


def _pair_fetch(rules: list[str]) -> tuple[FetchRuleSet, FetchRuleSet]:
    return _pair(FetchRuleSet, rules)


def _same(fast: Callable[..., object], slow: Callable[..., object], *args: object) -> object:
    """Both give the same decision (twice: the second call is a memo hit) or both raise."""
    for _ in range(2):
        try:
            want: object = slow(*args)
        except Exception as exc:  # the checker turns any exception into a denial
            with pytest.raises(type(exc)):
                fast(*args)
            return exc
        got = fast(*args)
        assert got == want, (args, got, want)
        assert type(got) is type(want)
    return want


# -- the accelerator is the one in use ------------------------------------------------------


def test_the_accelerator_is_built_and_used_by_the_checker() -> None:
    # `make test` builds it (setup.py, gcc); without a compiler the install falls back to
    # the Python reference, which the rest of this file proves decides the same.
    manifest = {"name": "p", "permissions": {"fs": ["./a/*"], "fetch": ["*.example.com"]}}
    with _accel.accelerated():
        assert _accel.speedups_status() == {
            "fs": True,
            "fetch": True,
            "fs_read": True,
            "poll": True,
            "why": "",
        }
        policy = PermissionPolicy.from_manifest(manifest, root="/srv")
    checker = PermissionChecker(policy)
    assert checker._fs_check == policy.fs._matcher.check  # type: ignore[union-attr]
    assert checker._fetch_check == policy.fetch._matcher.check  # type: ignore[union-attr]


def test_the_environment_switch_turns_the_accelerator_off_in_a_fresh_process() -> None:
    code = (
        "from suaveplan_sandbox.permissions import PermissionPolicy, speedups_status\n"
        "m = {'name': 'p', 'permissions': {'fs': ['./a/*'], 'fetch': ['a.example.com']}}\n"
        "p = PermissionPolicy.from_manifest(m, root='/srv')\n"
        "print(speedups_status(), p.fs._matcher, p.fetch._matcher)\n"
    )
    out = {}
    for value in ("1", "0"):
        env = dict(os.environ, **{_accel.DISABLE_ENV: value})
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        out[value] = run.stdout.strip()
    assert out["1"] == (
        "{'fs': False, 'fetch': False, 'fs_read': False, 'poll': False,"
        " 'why': 'disabled by SUAVEPLAN_SANDBOX_NO_SPEEDUPS'}"
        " None None"
    )
    assert out["0"].startswith(
        "{'fs': True, 'fetch': True, 'fs_read': True, 'poll': True, 'why': ''} <suaveplan_sandbox."
    )


def test_pure_python_switch_restores_itself() -> None:
    with _accel.accelerated():
        with _accel.pure_python():
            assert _accel.fs_matcher() is None
            assert _accel.fetch_matcher() is None
            status = _accel.speedups_status()
            assert status["fs"] is False
            assert status["fetch"] is False
            assert status["fs_read"] is False
            assert status["poll"] is False
            assert str(status["why"]).startswith("disabled")
        assert _accel.fs_matcher() is _speedups.FsMatcher
        assert _accel.fetch_matcher() is _speedups.FetchMatcher


def test_a_policy_built_under_pure_python_gets_no_c_matchers_even_for_cached_rules() -> None:
    manifest = {"name": "p", "permissions": {"fs": ["./c/*"], "fetch": ["c.example.com"]}}
    with _accel.accelerated():
        fast = PermissionPolicy.from_manifest(manifest, root="/srv")
    with _accel.pure_python():
        slow = PermissionPolicy.from_manifest(manifest, root="/srv")
    assert fast.fs._matcher is not None
    assert fast.fetch._matcher is not None
    assert slow.fs._matcher is None
    assert slow.fetch._matcher is None


# -- fs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", _PATHS, ids=[case["note"] for case in _PATHS])
def test_fs_vector_in_c_matches_the_reference(case: dict[str, Any]) -> None:
    fast, slow = _pair_fs(case["rules"])
    decision = _same(fast.fast_check, slow.check, case["input"], case.get("mode", "read"))
    if case["expect"] == "allow":
        assert isinstance(decision, Allow)
        assert decision.rule == case["rule"]
    else:
        assert decision == Deny(capability="fs", reason=DenyReason(case["expect"]))


_SEGMENTS = st.sampled_from(["a", "b", "ab", ".", "..", "", "x.json", "*", "a*", "é", "..."])
_FS_RULES = st.builds(
    lambda rw, segs: ("rw:" if rw else "") + "./" + "/".join(segs),
    st.booleans(),
    st.lists(_SEGMENTS, min_size=1, max_size=4),
)
_PATH_TEXT = st.one_of(
    st.builds("/".join, st.lists(_SEGMENTS, max_size=8)),
    st.text(alphabet="/.abx*\x00é", max_size=40),
    st.text(max_size=30),
)
_MODES = st.sampled_from(["read", "write", "append", "", None, 0])


@settings(max_examples=400, deadline=None)
@given(st.lists(_FS_RULES, min_size=1, max_size=5), st.lists(_PATH_TEXT, max_size=6), _MODES)
def test_fs_c_matches_the_reference_on_generated_rules_and_paths(
    rules: list[str], paths: list[str], mode: object
) -> None:
    try:
        fast, slow = _pair_fs(rules)
    except FsRuleError:
        return
    for path in paths:
        _same(fast.fast_check, slow.check, path, mode)
        _same(fast.fast_check, slow.check, "./" + path, mode)
        _same(fast.fast_check, slow.check, "/" + path + "/", mode)


@pytest.mark.parametrize(
    "path",
    [
        "a" * 255,  # the last length on the C fast path
        "a" * 256,  # the first one handed to the Python normaliser
        "a/" * 127 + "a",  # 255 chars, 128 segments
        "/" * 255,
        "./" * 127 + ".",
        "../" * 85,
        "a/" * 100 + "../" * 100 + "a",
        "a/" * 50 + "../" * 51 + "a",  # climbs above the root by one
        "a/b/../../../etc/passwd",
        "a\x00",
        "\x00" * 255,
        "uploads/\x00/../x",
        "é",
        "a/" * 120 + "é",
        "\ud800",  # a lone surrogate (cannot be encoded)
        "x" * 300 + "/" + "y" * 10,  # a segment over 255 bytes
        "a/" * 2100,  # over 4096 bytes
        "..",
        ".",
        "/",
        "//",
        "./uploads",
        "uploads/",
        ".uploads/x",
        "uploads/..x",
        "uploadsX/a",
    ],
)
@pytest.mark.parametrize("mode", ["read", "write"])
def test_fs_c_matches_the_reference_at_its_bounds(path: str, mode: str) -> None:
    rules = ["./uploads/*", "rw:./a/*", "./a*/b", "./*/x", "./" + "a/" * 60 + "*"]
    fast, slow = _pair_fs(rules)
    _same(fast.fast_check, slow.check, path, mode)


@pytest.mark.parametrize("path", [None, 1, b"uploads/a", ["uploads/a"]])
def test_fs_c_denies_non_string_paths(path: object) -> None:
    fast, slow = _pair_fs(["./uploads/*"])
    assert _same(fast.fast_check, slow.check, path, "read") == _DENY_INVALID


def test_fs_c_treats_a_str_subclass_path_as_invalid_like_the_reference() -> None:
    class Sneaky(str):
        __slots__ = ()

    fast, slow = _pair_fs(["./uploads/*"])
    assert _same(fast.fast_check, slow.check, Sneaky("uploads/a"), "read") == _DENY_INVALID


def test_fs_c_compares_mode_with_python_equality() -> None:
    class AlwaysRead:
        def __eq__(self, other: object) -> bool:
            return other == "read"

        __hash__ = object.__hash__

    class Raises:
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no")

        __hash__ = object.__hash__

    fast, slow = _pair_fs(["rw:./uploads/*"])
    assert isinstance(_same(fast.fast_check, slow.check, "uploads/a", AlwaysRead()), Allow)
    assert isinstance(_same(fast.fast_check, slow.check, "uploads/a", Raises()), RuntimeError)


def test_fs_c_takes_mode_by_keyword_and_rejects_bad_arguments() -> None:
    fast, _ = _pair_fs(["rw:./uploads/*"])
    check: Any = fast.fast_check
    assert check("uploads/a", mode="write") == Allow(rule="rw:./uploads/*", target="uploads/a")
    assert check(path="uploads/a") == Allow(rule="rw:./uploads/*", target="uploads/a")
    bad_calls: list[tuple[tuple[object, ...], dict[str, object]]] = [
        ((), {}),
        (("a", "read", "x"), {}),
        (("a",), {"bogus": 1}),
        (("a",), {"path": "b"}),
    ]
    for args, kwargs in bad_calls:
        with pytest.raises(TypeError):
            check(*args, **kwargs)


def test_a_regex_rule_failing_inside_the_c_walk_propagates_like_the_reference() -> None:
    fast, _ = _pair_fs(["./a*b"])

    def boom(target: str) -> object:
        raise RuntimeError("matcher bug")

    bucket = fast._globs["."]
    fast._globs["."] = ((bucket[0][0], boom, bucket[0][2], bucket[0][3]),)
    with pytest.raises(RuntimeError, match="matcher bug"):
        fast.fast_check("axb", "read")


def test_fs_matcher_rejects_malformed_tables_without_crashing() -> None:
    def matcher(**overrides: object) -> Any:
        kwargs: dict[str, object] = {
            "exact": {},
            "globs": {},
            "root_globs": False,
            "first_glob": -1,
            "read_cache": {},
            "write_cache": {},
            "denials": _DENIALS,
            "deny_mode": _DENY_MODE,
            "deny_outside": _DENY_OUTSIDE,
            "deny_invalid": _DENY_INVALID,
            "allow_type": Allow,
            "normalize": normalize_request_path,
            "cache_entries": 16,
            "cached_chars": 512,
        }
        kwargs.update(overrides)
        return _speedups.FsMatcher(**kwargs)  # type: ignore[arg-type]

    with pytest.raises(TypeError):
        matcher(exact=[])
    with pytest.raises(AttributeError):
        matcher(allow_type=Deny)  # no `rule`/`target` slots

    class NotSlots:
        rule = None
        target = None

    with pytest.raises(TypeError):
        matcher(allow_type=NotSlots)  # attributes, but not slots
    with pytest.raises(TypeError):
        matcher(normalize=None)
    m = matcher()
    with pytest.raises(RuntimeError):
        m.__init__(**{})  # already initialised: no half-replaced tables
    with pytest.raises(TypeError):
        matcher(exact={"a": "not a tuple"}).check("a", "read")
    with pytest.raises(TypeError):
        matcher(exact={"a": ((0, None, True),)}).check("a", "read")
    with pytest.raises(TypeError):
        matcher(globs={"a": ("bad", (0, None, True, "x"))}, first_glob=5).check("a/b", "read")
    with pytest.raises(TypeError):
        _speedups.FsMatcher.__new__(_speedups.FsMatcher).check("a")  # never initialised
    with pytest.raises(TypeError):
        _speedups.FetchMatcher.__new__(_speedups.FetchMatcher).check("https://a.com/")


def test_fs_memo_stays_bounded_in_c() -> None:
    fast, _ = _pair_fs(["./uploads/*"])
    for i in range(10_000):
        fast.fast_check(f"uploads/{i}", "read")
    assert 0 < len(fast._read_cache) <= 4096
    long_path = "u/" * 300  # 600 chars: past the memo's 512
    assert fast.fast_check(long_path, "read") == _DENY_OUTSIDE
    assert long_path not in fast._read_cache


# -- fetch ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", _URLS, ids=[case["note"] for case in _URLS])
def test_fetch_vector_in_c_matches_the_reference(case: dict[str, Any]) -> None:
    fast, slow = _pair_fetch(case["rules"])
    decision = _same(fast.fast_check, slow.check, case["input"])
    if case["expect"] == "allow":
        assert isinstance(decision, Allow)
        assert decision.rule == case["rule"]
    else:
        assert decision == Deny(capability="fetch", reason=DenyReason(case["expect"]))


_LABEL = st.sampled_from(["a", "b", "api", "example", "com", "xn--bcher-kva", "0", "12", "0x7f"])
_HOST = st.one_of(
    st.builds(".".join, st.lists(_LABEL, min_size=1, max_size=5)),
    st.sampled_from(["[::1]", "[::ffff:7f00:1]", "127.1", "2130706433", "1.2.3.4.", "ß.de"]),
)
_FETCH_RULES = st.builds(
    lambda http, wild, host, port: (
        ("http:" if http else "") + ("*." if wild else "") + host + (f":{port}" if port else "")
    ),
    st.booleans(),
    st.booleans(),
    _HOST,
    st.sampled_from([None, 80, 443, 8080]),
)
_URL_TEXT = st.one_of(
    st.builds(
        lambda scheme, user, host, dot, port, path: f"{scheme}//{user}{host}{dot}{port}{path}",
        st.sampled_from(["https:", "http:", "HTTPS:", "ftp:", "ws:", "file:", "data:", "h:"]),
        st.sampled_from(["", "u@", "u:p@", "@", "a@b@"]),
        _HOST,
        st.sampled_from(["", "."]),
        st.sampled_from(
            [
                *("", ":80", ":443", ":8080", ":0", ":65536", ":"),
                *(":00", ":0000", ":0080", ":00443", ":1", ":65535", ":99999"),
            ]
        ),
        st.sampled_from(["", "/", "/x?y#z", "\\x", "/%2e%2e/", "/é"]),
    ),
    st.text(max_size=40),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_FETCH_RULES, min_size=1, max_size=4), st.lists(_URL_TEXT, max_size=6))
def test_fetch_c_matches_the_reference_on_generated_rules_and_urls(
    rules: list[str], urls: list[str]
) -> None:
    try:
        fast, slow = _pair_fetch(rules)
    except FetchRuleError:
        return
    for url in urls:
        _same(fast.fast_check, slow.check, url)


@pytest.mark.parametrize(
    "url",
    [
        "https://a.example.com/" + "x" * 5000,  # longer than the memo keeps
        "https://" + "a." * 120 + "example.com/",  # many labels
        "https://example.com\ud800/",  # a lone surrogate
        "https://exa\x00mple.com/",
        "https://\x00/",
        "",
        "https://",
        "https://[::1]:8080/",
        "https://1.2.3.4/",
        "https://a.example.com.:443/",
        "http://a.example.com/",
        "https://user:pw@a.example.com@evil.com/",
        "https://a.example.com%2f@evil.com/",
        "https://é.example.com/",
        "javascript:alert(1)",
        # Port 0 is `invalid-url` with the parse (whatever the scheme); its neighbours are not.
        "https://a.example.com:0/",
        "https://a.example.com:00/",
        "https://a.example.com:0000/",
        "https://a.example.com:\t0/",
        "http://a.example.com:0/",
        "ftp://a.example.com:0/",
        "https://[::1]:0/",
        "https://u:p@a.example.com:0/",
        "https://a.example.com:1/",
        "https://a.example.com:0080/",
        "http://a.example.com:0080/",
        "https://a.example.com:65535/",
        "https://a.example.com:65536/",
        "https://[::1]:08080/",
    ],
)
def test_fetch_c_matches_the_reference_on_hostile_urls(url: str) -> None:
    fast, slow = _pair_fetch(["*.example.com", "http:a.example.com:80", "[::1]:8080"])
    _same(fast.fast_check, slow.check, url)


@pytest.mark.parametrize(
    "port", ["0", "00", "0000", "1", "01", "80", "0080", "443", "65535", "065535", "65536", ""]
)
@pytest.mark.parametrize("scheme", ["https", "http", "ftp"])
@pytest.mark.parametrize("host", ["a.example.com", "[::1]", "1.2.3.4", "elsewhere.test"])
def test_fetch_c_and_the_reference_agree_on_port_zero_and_its_neighbours(
    port: str, scheme: str, host: str
) -> None:
    fast, slow = _pair_fetch(["*.example.com", "http:a.example.com:80", "[::1]", "1.2.3.4"])
    decision = _same(fast.fast_check, slow.check, f"{scheme}://{host}:{port}/p")
    # An explicit port 0, however spelt, and a port past 65535 (WHATWG does not parse it).
    invalid = (port != "" and port.strip("0") == "") or port == "65536"
    assert (decision == Deny(capability="fetch", reason=DenyReason.INVALID_URL)) is invalid


@pytest.mark.parametrize("url", [None, 1, b"https://a.example.com/"])
def test_fetch_c_denies_non_string_urls(url: object) -> None:
    fast, slow = _pair_fetch(["*.example.com"])
    assert _same(fast.fast_check, slow.check, url) == Deny(
        capability="fetch", reason=DenyReason.INVALID_URL
    )


def test_bind_ada_only_binds_a_library_already_loaded() -> None:
    with pytest.raises(ImportError):
        _speedups.bind_ada("/nonexistent/libnothing.so")
    with pytest.raises(ImportError):  # loaded, but not ada
        _speedups.bind_ada(_speedups.__file__)


def test_fetch_matcher_rejects_malformed_tables_without_crashing() -> None:
    deny = Deny(capability="fetch", reason=DenyReason.HOST_NOT_IN_ALLOWLIST)

    def matcher(**overrides: object) -> Any:
        kwargs: dict[str, object] = {
            "exact": {},
            "suffix": {},
            "suffix_labels": frozenset(),
            "cache": {},
            "deny_invalid": deny,
            "deny_scheme": deny,
            "deny_host": deny,
            "allow_type": Allow,
            "cache_entries": 16,
            "cached_chars": 2048,
        }
        kwargs.update(overrides)
        return _speedups.FetchMatcher(**kwargs)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match="out of range"):
        matcher(suffix_labels=frozenset({0}))
    with pytest.raises(TypeError):
        matcher(suffix_labels=frozenset({"2"}))
    with pytest.raises(TypeError):
        matcher(exact={"a.com": [(0, None, False, "a.com")]}).check("https://a.com/")
    with pytest.raises(TypeError):
        matcher(exact={"a.com": ((0, "443", False, "a.com"),)}).check("https://a.com/")
    assert matcher().check("https://a.com/") is deny


# -- memory ---------------------------------------------------------------------------------


def test_c_checks_leak_no_memory() -> None:
    fs, _ = _pair_fs(["./uploads/*", "rw:./data/*.json", "./files/a.txt"])
    fetch, _ = _pair_fetch(["*.example.com", "api.other.org"])
    paths = [f"./uploads/{i}/x.png" for i in range(3000)] + ["../x", "a\x00", "é/" * 200]
    urls = [f"https://h{i}.example.com/p" for i in range(3000)] + ["nope", "ftp://a.b/"]

    def round_trip() -> None:
        fs._read_cache.clear()
        fs._write_cache.clear()
        fetch._cache.clear()
        for p in paths:
            fs.fast_check(p, "read")
            fs.fast_check(p, "write")
        for u in urls:
            fetch.fast_check(u)
        fs._read_cache.clear()
        fs._write_cache.clear()
        fetch._cache.clear()

    round_trip()
    gc.collect()
    tracemalloc.start()
    try:
        round_trip()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(5):
            round_trip()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # 5 x 12,000 checks: a leaked decision or string per check would be megabytes.
    assert grown < 64 * 1024, grown


def test_c_checks_from_many_threads_agree_with_the_reference() -> None:
    # The blocking facades and WASM adapters call one checker from several threads.
    fs, fs_ref = _pair_fs(["./uploads/*", "rw:./data/*.json", "./a*/b"])
    fetch, fetch_ref = _pair_fetch(["*.example.com", "http:api.other.org"])
    paths = [f"./{d}/{i}/x.json" for i in range(500) for d in ("uploads", "data", "ax", "..")]
    urls = [
        f"{s}://h{i}.{h}/p"
        for i in range(500)
        for s in ("https", "http")
        for h in (
            "example.com",
            "api.other.org",
            "evil.com",
        )
    ]
    want_fs = [fs_ref.check(p, m) for p in paths for m in ("read", "write")]
    want_fetch = [fetch_ref.check(u) for u in urls]
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(3):
                got_fs = [fs.fast_check(p, m) for p in paths for m in ("read", "write")]
                assert got_fs == want_fs
                assert [fetch.fast_check(u) for u in urls] == want_fetch
                fs._read_cache.clear()  # races with the other threads' memo inserts
                fetch._cache.clear()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
