"""`open_preopens`: each vetted preopen directory held by descriptor, reached from `/` without a
link, in both modes of the shared walk (`adapters._beneath`): one `openat2`, or one no-follow
open per component."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _descriptors import descriptors_under
from suaveplan_sandbox.adapters._beneath import openat2_available
from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.wasm import _sandbox
from suaveplan_sandbox.wasm._sandbox import PreopenSpec, open_preopens

MODES = [pytest.param(True, id="openat2"), pytest.param(False, id="per-component")]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    use_openat2 = bool(request.param)
    if use_openat2 and not openat2_available():
        pytest.fail("this kernel has no openat2: the openat2 mode cannot be tested here")
    monkeypatch.setattr(_sandbox, "openat2_available", lambda: use_openat2)
    return use_openat2


def _spec(host: Path) -> PreopenSpec:
    return PreopenSpec(host=host, guest="/" + host.name, writable=False)


def test_each_preopen_is_its_directory(root: Path, mode: bool) -> None:
    real = root.resolve()
    fds = open_preopens([_spec(real / "uploads"), _spec(real / "private")])
    try:
        assert [sorted(os.listdir(fd)) for fd in fds] == [["a.txt"], ["s.txt"]]
    finally:
        for fd in fds:
            os.close(fd)


def test_no_preopens_opens_nothing(mode: bool) -> None:
    assert open_preopens([]) == []


@pytest.mark.parametrize("swapped", ["root", "root/uploads"])
def test_a_component_swapped_for_a_link_after_vetting_is_refused_and_nothing_leaks(
    root: Path, mode: bool, swapped: str
) -> None:
    # Vetted at create (resolved, no link), then a component becomes a link to a directory
    # with the same shape: the walk refuses it, and the preopen opened before it is closed.
    real = root.resolve()
    specs = [_spec(real / "private"), _spec(real / "uploads")]
    target = real.parent / swapped
    decoy = real.parent / "decoy"
    os.rename(target, decoy)
    target.symlink_to(decoy, target_is_directory=True)
    before = descriptors_under(real.parent)
    with pytest.raises(SuaveplanError) as info:
        open_preopens(specs)
    assert info.value.code == "SAND_WASM_PREOPEN_DENIED"
    assert descriptors_under(real.parent) == before
