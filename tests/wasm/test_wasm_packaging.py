"""Guest authors get the C header and the ABI document from the installed package."""

from __future__ import annotations

import fnmatch
import importlib.resources
import tomllib
from pathlib import Path

REPO = Path(__file__).parents[2]
SHIPPED = ("wasm/include/suaveplan.h", "wasm/include/suaveplan-abi.md")


def test_the_header_and_the_abi_document_are_package_data() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["suaveplan_sandbox"]
    package = importlib.resources.files("suaveplan_sandbox")
    for name in SHIPPED:
        assert any(fnmatch.fnmatch(name, g) for g in globs), f"{name} is not package data"
        assert package.joinpath(name).is_file(), name


def test_the_shipped_abi_document_is_the_docs_page() -> None:
    shipped = importlib.resources.files("suaveplan_sandbox").joinpath(SHIPPED[1]).read_text()
    assert shipped == (REPO / "docs" / "wasm-abi.md").read_text(), (
        "cp docs/wasm-abi.md src/suaveplan_sandbox/wasm/include/suaveplan-abi.md"
    )


def test_the_header_declares_every_host_import_with_the_abi_errnos() -> None:
    from suaveplan_sandbox.wasm import Errno
    from suaveplan_sandbox.wasm._imports import define

    header = importlib.resources.files("suaveplan_sandbox").joinpath(SHIPPED[0]).read_text()
    names: list[str] = []

    class _Recorder:
        def define_func(self, module: str, name: str, *_: object, **__: object) -> None:
            assert module == "suaveplan"
            names.append(name)

    define(_Recorder(), lambda: None)  # type: ignore[arg-type, return-value]
    assert names
    for name in names:
        assert f'SUAVEPLAN_IMPORT("{name}")' in header, name
    for errno in ("ACCES", "BADF", "CANCELED", "FAULT", "INVAL", "IO", "MFILE", "NOBUFS", "NOSYS"):
        assert f"SUAVEPLAN_E{errno} = {Errno[errno].value}," in header, errno
