"""A careless caller of `WasmSandbox.run` gets a coded error, and the sandbox stays usable.

`argv` is a sequence of `str` (not a `str` itself, which would be split into letters), each
without NUL (C would cut it there) and encodable as UTF-8; `stdin` is `bytes`, `bytearray` or
`memoryview`. Anything else is `SAND_INVALID_ARGUMENT` naming the argument, refused before
the guest runs, never a bare TypeError, AttributeError or UnicodeEncodeError from the host.
"""

from __future__ import annotations

import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import WasmSandbox, create_wasm_sandbox, create_wasm_sandbox_blocking

FSPROBE = Path(__file__).parent / "fixtures" / "fsprobe.wasm"
ECHO = ["fsprobe", "echo", "-"]  # copies stdin to stdout, "err\n" to stderr, exits 7


def _policy(root: Path) -> PermissionPolicy:
    return PermissionPolicy.from_manifest(
        {"name": "run-args", "permissions": {"fs": []}}, root=root
    )


class _Text(str):
    """A `str` subclass: still a str."""


def _released() -> memoryview:
    view = memoryview(b"gone")
    view.release()
    return view


BAD_RUN_ARGUMENTS: list[tuple[str, object]] = [
    ("argv", 5),
    ("argv", None),
    ("argv", "fsprobe"),  # a str is a sequence of one-letter strs
    ("argv", b"fsprobe"),
    ("argv", bytearray(b"fsprobe")),
    ("argv", memoryview(b"fsprobe")),
    ("argv", (c for c in ECHO)),  # not a sequence
    ("argv", [1]),
    ("argv", ["fsprobe", None]),
    ("argv", [b"fsprobe"]),
    ("argv", ["fsprobe", "echo\x00-"]),  # the guest would see "echo"
    ("argv", ["fsprobe", "\udc80"]),  # a lone surrogate: not UTF-8
    ("stdin", "x"),
    ("stdin", 5),
    ("stdin", None),
    ("stdin", [1, 2]),
    ("stdin", array.array("i", [1])),
    ("stdin", _released()),
]


@pytest.mark.parametrize(
    ("argument", "value"),
    BAD_RUN_ARGUMENTS,
    ids=[f"{a}-{i}" for i, (a, _v) in enumerate(BAD_RUN_ARGUMENTS)],
)
async def test_a_run_argument_it_cannot_use_is_refused_before_the_guest_runs(
    root: Path, monkeypatch: pytest.MonkeyPatch, argument: str, value: object
) -> None:
    async with await create_wasm_sandbox(wasm_module_path=FSPROBE, policy=_policy(root)) as sb:
        real_run_sync = sb._run_sync

        def never(*_a: object) -> None:
            raise AssertionError("the guest ran before the arguments were checked")

        monkeypatch.setattr(sb, "_run_sync", never)
        kwargs: dict[str, Any] = {"argv": ECHO, "stdin": b"", argument: value}
        with pytest.raises(SuaveplanError) as info:
            await sb.run(**kwargs)
        assert info.value.code == "SAND_INVALID_ARGUMENT"
        assert info.value.details["argument"] == argument

        monkeypatch.setattr(sb, "_run_sync", real_run_sync)
        assert sb.state == "ready"
        res = await sb.run(argv=ECHO, stdin=b"still here")
        assert (res.exit_code, res.stdout) == (7, b"still here")


def _accepted_shapes() -> Iterator[tuple[object, object]]:
    yield tuple(ECHO), b"tuple"
    yield [_Text(a) for a in ECHO], b"str subclass"
    yield ECHO, bytearray(b"bytearray")
    yield ECHO, memoryview(b"..memoryview")[2:]


@pytest.mark.parametrize(("argv", "stdin"), list(_accepted_shapes()))
async def test_every_documented_argument_shape_is_still_accepted(
    root: Path, argv: Any, stdin: Any
) -> None:
    async with await create_wasm_sandbox(wasm_module_path=FSPROBE, policy=_policy(root)) as sb:
        res = await sb.run(argv=argv, stdin=stdin)
    assert (res.exit_code, res.stdout) == (7, bytes(stdin))


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [({"argv": 5}, "argv"), ({"argv": ECHO, "stdin": "x"}, "stdin")],
    ids=["argv", "stdin"],
)
def test_the_blocking_facade_passes_the_same_error_through(
    root: Path, kwargs: dict[str, Any], argument: str
) -> None:
    with create_wasm_sandbox_blocking(wasm_module_path=FSPROBE, policy=_policy(root)) as sb:
        with pytest.raises(SuaveplanError) as info:
            sb.run(**kwargs)
        assert info.value.code == "SAND_INVALID_ARGUMENT"
        assert info.value.details["argument"] == argument
        assert sb.run(argv=ECHO, stdin=b"ok").stdout == b"ok"


def test_wasm_sandbox_run_takes_only_argv_and_stdin() -> None:
    # If run grows an argument (env, cwd), it needs a row in BAD_RUN_ARGUMENTS.
    import inspect

    params = inspect.signature(WasmSandbox.run).parameters
    assert list(params) == ["self", "argv", "stdin"]
