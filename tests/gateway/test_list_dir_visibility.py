"""`fs.list_dir` from the attacker's side: a listing never names an entry no rule covers.

Listing a directory needs read access to the directory itself, as before; what comes back is
only the entries the plugin could read (`check_fs(dir/name, "read")` is Allow). A rule that
grants a directory exactly, or a glob about files that also matches a directory, used to hand
out every name in it. Run against the real `BeneathRootFs` on a temporary tree.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from suaveplan_sandbox.adapters import Adapters, BeneathRootFs
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.gateway import Gateway
from suaveplan_sandbox.metrics import PERMISSION_DENIED, InMemoryMetrics
from suaveplan_sandbox.permissions import Allow, PermissionChecker, PermissionPolicy

# Every entry of the tree; directories end in `/`.
_TREE = (
    "data/a.csv",
    "data/b.csv",
    "data/.hidden.csv",
    "data/notes.txt",
    "data/.env",
    "data/*",
    "data/[a].csv",
    "data/report?.csv",
    "data/secret.csv/",
    "data/secret.csv/passwords.txt",
    "data/secret.csv/inner.csv",
    "data/sub/",
    "data/sub/deep.csv",
    "data/sub/deep.txt",
    "config.json",
    "private.key",
)


def _build(root: Path) -> None:
    for entry in _TREE:
        path = root / entry
        if entry.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")


class _ListingOnlyFs:
    """An fs adapter that can only list (the tests here do nothing else)."""

    def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        raise AssertionError("not listed")

    def write_bytes(self, path: str, data: bytes) -> None:
        raise AssertionError("not listed")

    def exists(self, path: str) -> bool:
        raise AssertionError("not listed")


class _BlockingFs(_ListingOnlyFs):
    def __init__(self, fs: BeneathRootFs) -> None:
        self.fs = fs

    def list_dir(self, path: str) -> list[str]:
        return self.fs._list_sync(path)


class _Rig:
    def __init__(self, root: Path, rules: Sequence[str]) -> None:
        self.metrics = InMemoryMetrics()
        manifest: dict[str, Any] = {"name": "lister", "permissions": {"fs": list(rules)}}
        policy = PermissionPolicy.from_manifest(manifest, root=root)
        self.checker = PermissionChecker(policy, metrics=self.metrics)
        self.fs = BeneathRootFs(root)
        self.gateway = Gateway(checker=self.checker, adapters=Adapters(fs=self.fs))
        # The blocking entry point (the WASM host's), with a plain-`def` adapter.
        self.sync_gateway = Gateway(
            checker=self.checker, adapters=Adapters(fs=_BlockingFs(self.fs))
        )

    async def listing(self, path: str) -> list[str]:
        names = await self.gateway.dispatch("fs", "list_dir", {"path": path})
        assert isinstance(names, list)
        # Every name shown is one the plugin may read: never a name no rule covers.
        for name in names:
            child = name if path in (".", "/") else f"{path}/{name}"
            assert isinstance(self.checker.policy.fs.check(child), Allow), child
        # Every entry point filters alike: the blocking one (WASM host) and the eager one
        # (VM host), which answers a plain-`def` adapter inline.
        assert names == self.sync_listing(path)
        done, eager = self.sync_gateway.dispatch_eager("fs", "list_dir", {"path": path})
        assert done and eager == names
        return names

    def sync_listing(self, path: str) -> list[str]:
        names = self.sync_gateway.dispatch_sync("fs", "list_dir", {"path": path})
        assert isinstance(names, list)
        return names

    def denials(self) -> float:
        return self.metrics.value(PERMISSION_DENIED.name)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    tree = tmp_path / "root"
    tree.mkdir()
    _build(tree)
    yield tree


async def test_a_file_glob_that_matches_a_directory_lists_only_the_files_it_covers(
    root: Path,
) -> None:
    rig = _Rig(root, ["./data/*.csv"])
    # `data/secret.csv` is a directory the glob matches as a path: listing it is allowed,
    # but `passwords.txt` is not `*.csv` and must not be named.
    assert await rig.listing("data/secret.csv") == ["inner.csv"]
    # `data` itself is not granted by a rule about the files in it.
    with pytest.raises(SuaveplanError) as info:
        await rig.gateway.dispatch("fs", "list_dir", {"path": "data"})
    assert info.value.details["reason"] == "path-not-in-allowlist"


async def test_a_directory_rule_without_a_star_lists_nothing_beneath_it(root: Path) -> None:
    # `./data` grants that one path (DESIGN: a rule without `*` grants exactly that path).
    rig = _Rig(root, ["./data"])
    assert await rig.listing("data") == []


async def test_exact_file_rules_show_only_those_files_not_their_siblings(root: Path) -> None:
    rig = _Rig(root, ["./data", "./data/a.csv", "./data/.env"])
    assert await rig.listing("data") == [".env", "a.csv"]


async def test_the_root_lists_only_the_entries_a_rule_reaches(root: Path) -> None:
    rig = _Rig(root, ["./", "./config.json"])
    assert await rig.listing(".") == ["config.json"]
    assert await rig.listing("/") == ["config.json"]


async def test_a_prefix_glob_shows_only_names_with_that_prefix(root: Path) -> None:
    rig = _Rig(root, ["./data/*"])
    rig_narrow = _Rig(root, ["./data", "./data/report*"])
    assert await rig_narrow.listing("data") == ["report?.csv"]
    # `dir/*` covers everything beneath it, hidden names and glob characters included.
    assert await rig.listing("data") == [
        "*",
        ".env",
        ".hidden.csv",
        "[a].csv",
        "a.csv",
        "b.csv",
        "notes.txt",
        "report?.csv",
        "secret.csv",
        "sub",
    ]


async def test_glob_metacharacters_in_names_are_only_text(root: Path) -> None:
    # A file literally named `*` is not a wildcard: the rule `data/a*` does not cover it, and
    # neither `[a].csv` nor `report?.csv` is matched as a character class or a `?`.
    rig = _Rig(root, ["./data", "./data/a*", "./data/report1.csv", "./data/a.csv"])
    assert await rig.listing("data") == ["a.csv"]


async def test_a_star_in_the_middle_of_a_rule_spans_slashes_but_filters_the_listing(
    root: Path,
) -> None:
    # `data/*.csv` spans `/`: `data/sub/deep.csv` is readable, `data/sub/deep.txt` is not.
    rig = _Rig(root, ["./data/*.csv", "./data/sub"])
    assert await rig.listing("data/sub") == ["deep.csv"]


async def test_double_star_is_one_star(root: Path) -> None:
    rig = _Rig(root, ["./data/**.csv", "./data/sub"])
    assert await rig.listing("data/sub") == ["deep.csv"]


async def test_names_left_out_of_a_listing_are_not_counted_as_denials(
    root: Path,
) -> None:
    rig = _Rig(root, ["./data"])
    assert await rig.listing("data") == []
    assert rig.denials() == 0


async def test_an_adapter_that_returns_odd_names_never_passes_them_through(root: Path) -> None:
    class _OddFs(_ListingOnlyFs):
        def list_dir(self, path: str) -> list[str]:
            not_a_name = cast(str, 7)
            return [
                "ok.csv",
                "../private.key",
                "a/b.csv",
                ".",
                "..",
                "",
                not_a_name,
                "x\0.csv",
                "é.csv",
            ]

    metrics = InMemoryMetrics()
    policy = PermissionPolicy.from_manifest(
        {"name": "lister", "permissions": {"fs": ["./data/*"]}}, root=root
    )
    gateway = Gateway(
        checker=PermissionChecker(policy, metrics=metrics), adapters=Adapters(fs=_OddFs())
    )
    names = await gateway.dispatch("fs", "list_dir", {"path": "data"})
    assert names == ["ok.csv", "é.csv"]


async def test_an_undecodable_name_no_request_could_name_is_not_listed(root: Path) -> None:
    raw = os.fsencode(root / "data") + b"/bad\xff.csv"
    with open(raw, "wb") as f:
        f.write(b"x")
    rig = _Rig(root, ["./data/*"])
    assert "bad\udcff.csv" not in await rig.listing("data")
