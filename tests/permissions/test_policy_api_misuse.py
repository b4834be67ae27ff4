"""A careless or hostile caller of `PermissionPolicy.from_manifest` gets a coded error.

Wrong types and odd values for `root=`, `sql_dialect=` and `max_sql_length=`, manifest files
that are not regular files, and `Manifest` objects made without validation: each is a
`SuaveplanError` with a registered code, never a bare `TypeError`/`ValueError`, and nothing
blocks.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import Manifest, PermissionPolicy

_M = {"name": "p"}


class _BytesPath:
    """An `os.PathLike[bytes]`: `Path()` raises TypeError on it."""

    def __fspath__(self) -> bytes:
        return b"/srv/plugin"


def _refused(call: object) -> SuaveplanError:
    assert callable(call)
    with pytest.raises(SuaveplanError) as info:
        call()
    return info.value


@pytest.mark.parametrize(
    "root",
    [5, None, b"/tmp", "", "/srv/a\x00b", _BytesPath()],
    ids=["int", "none", "bytes", "empty", "nul", "pathlike-bytes"],
)
def test_a_root_that_names_no_directory_is_an_invalid_argument(root: object) -> None:
    err = _refused(lambda: PermissionPolicy.from_manifest(_M, root=root))  # type: ignore[arg-type]
    assert err.code == "SAND_INVALID_ARGUMENT"
    assert err.details["argument"] == "root"


def test_a_relative_root_is_made_absolute_once_when_the_policy_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    policy = PermissionPolicy.from_manifest(_M, root="plugins/x")
    assert policy.root == tmp_path / "plugins" / "x"


@pytest.mark.parametrize("dialect", ["mysql", None, ["sqlite"], "SQLITE"])
def test_an_unknown_sql_dialect_is_an_invalid_argument(dialect: object) -> None:
    err = _refused(lambda: PermissionPolicy.from_manifest(_M, root=".", sql_dialect=dialect))  # type: ignore[arg-type]
    assert err.code == "SAND_INVALID_ARGUMENT"
    assert err.details["argument"] == "sql_dialect"


@pytest.mark.parametrize("length", [-1, 0, True, 1.5, "10", None])
def test_a_max_sql_length_that_is_not_a_positive_int_is_an_invalid_argument(
    length: object,
) -> None:
    err = _refused(
        lambda: PermissionPolicy.from_manifest(_M, root=".", max_sql_length=length)  # type: ignore[arg-type]
    )
    assert err.code == "SAND_INVALID_ARGUMENT"
    assert err.details["argument"] == "max_sql_length"


def _load_within(path: object, seconds: float = 10.0) -> SuaveplanError:
    """The error loading `path` raises, from a thread, so a blocking open fails the test."""
    out: list[BaseException] = []

    def load() -> None:
        try:
            PermissionPolicy.from_manifest(path, root=".")  # type: ignore[arg-type]
        except BaseException as exc:  # handed to the test thread
            out.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "loading the manifest blocked"
    assert len(out) == 1 and isinstance(out[0], SuaveplanError), out
    return out[0]


def test_a_fifo_named_like_a_manifest_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "manifest.toml"
    os.mkfifo(fifo)  # nobody ever writes to it: an open for reading would wait for ever
    err = _load_within(fifo)
    assert err.code == "SAND_MANIFEST_INVALID"
    assert err.details["reason"] == "unreadable"
    assert err.details["file"] == str(fifo)


def test_a_manifest_linked_to_a_device_is_refused_before_its_driver_runs(tmp_path: Path) -> None:
    link = tmp_path / "manifest.toml"
    link.symlink_to("/dev/zero")
    err = _load_within(link)
    assert (err.code, err.details["reason"]) == ("SAND_MANIFEST_INVALID", "unreadable")


def test_a_manifest_path_with_a_nul_byte_is_unreadable_not_a_value_error(tmp_path: Path) -> None:
    err = _load_within(f"{tmp_path}/a\x00.toml")
    assert (err.code, err.details["reason"]) == ("SAND_MANIFEST_INVALID", "unreadable")


def test_a_manifest_path_like_object_of_bytes_is_a_manifest_error() -> None:
    err = _load_within(_BytesPath())
    assert err.code == "SAND_MANIFEST_INVALID"


@pytest.mark.parametrize(
    "make",
    [
        lambda: Manifest.model_construct(name=5),
        lambda: Manifest.model_construct(name="p", permissions={"fs": ["/etc/*"]}),
        lambda: Manifest.model_validate({"name": "p"}).model_copy(update={"name": "../evil"}),
        lambda: Manifest.model_validate({"name": "p"}).model_copy(
            update={"database": {"tablePrefix": "sqlite_"}}
        ),
    ],
    ids=["construct-int-name", "construct-absolute-rule", "copy-traversal-name", "copy-prefix"],
)
def test_a_manifest_object_made_without_validation_is_validated_again(make: object) -> None:
    assert callable(make)
    manifest = make()
    err = _refused(lambda: PermissionPolicy.from_manifest(manifest, root="."))
    assert err.code == "SAND_MANIFEST_INVALID"


def test_a_validated_manifest_object_is_used_as_it_is() -> None:
    manifest = Manifest.model_validate({"name": "p", "permissions": {"fs": ["./a/*"]}})
    policy = PermissionPolicy.from_manifest(manifest, root=".")
    assert policy.manifest is manifest
    assert policy.fs_rules == ("./a/*",)
