"""What leaves plugin code is an error the runtime built from exact plain data.

The runtime reads the plugin's exception to translate it (`str(exc)`, `NameError.name`, a
`SuaveplanError`'s `code`), and the worker then serialises the result with `to_wire` and the
protocol encoder. Before the second red-team pass, plugin code ran in both places and could
decide the outcome: a `__str__` raising a `SuaveplanError` left the translation unchecked
with any code, and a re-raised guard error carried the plugin's objects into `to_wire`. The
escape corpus (`wire_forge_code_*`, `wire_reraised_guard_error_details`) has the attacks.
These run the runtime in-process: nothing here needs a sealed worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.vm._guest import GuestRuntime, compile_bundle, load_plugin

PLUGIN = """
import functools

from suaveplan import SuaveplanError, events, fs, log


def _forged(*args):
    raise SuaveplanError("SAND_FS_NOT_FOUND", "forged", {"path": "/etc/shadow"})


class Loud(Exception):
    def __str__(self):
        _forged()


class Sliced(str):
    def __getitem__(self, index):
        return object()


class Quiet(Exception):
    def __str__(self):
        return Sliced("quiet words")


class Named(NameError):
    @property
    def name(self):
        _forged()


class Code(str):
    def __hash__(self):
        return hash("SAND_VM_ATTRIBUTE_FORBIDDEN")

    def __eq__(self, other):
        _forged()


class Mine(SuaveplanError):
    @property
    def code(self):
        _forged()

    @code.setter
    def code(self, value):
        pass


def exception_str_raises():
    raise Loud()


def exception_str_is_a_str_subclass():
    raise Quiet()


def name_error_name_raises():
    raise Named("n")


def subclass_code_raises():
    raise Mine("SAND_VM_ATTRIBUTE_FORBIDDEN", "mine")


def guard_error_code_replaced():
    try:
        getattr(fs, "_" * 2 + "globals" + "_" * 2)
    except SuaveplanError as err:
        err.code = Code("SAND_VM_ATTRIBUTE_FORBIDDEN")
        raise


def guard_error_details_replaced():
    try:
        getattr(fs, "_" * 2 + "globals" + "_" * 2)
    except SuaveplanError as err:
        err.message = Sliced("edited")
        err.details = {"name": Sliced("x"), "big": 2**80}
        raise err from Loud()


def guard_error_with_its_details():
    return fs.read_bytes({1})


def plain_error():
    raise ValueError("plain words")


class Module(str):
    def __hash__(self):
        return hash("plugin")

    def __eq__(self, other):
        _forged()


class Source:
    @property
    def __module__(self):
        return Module("plugin")


def wrapped():
    return "called"


functools.update_wrapper(wrapped, Source())


class Topic(str):
    def __hash__(self):
        return hash("orders")

    def __eq__(self, other):
        _forged()

    def __lt__(self, other):
        _forged()


SEEN = []


@events.subscribe(Topic("orders"))
def on_order(payload):
    SEEN.append(payload)


@events.subscribe("refunds")
def on_refund(payload):
    SEEN.append(payload)


def seen():
    return SEEN


class Glue(str):
    def join(self, items):
        return Sliced("glued")


class Text:
    def __str__(self):
        return Sliced("text %s")


def print_with_a_str_subclass_sep():
    print("a", "b", sep=Glue("-"))


def log_with_a_str_subclass_message():
    log.info(Text(), "x")
    log.info(Text())
"""


@pytest.fixture
def runtime(tmp_path: Path) -> tuple[GuestRuntime, list[tuple[str, object]]]:
    (tmp_path / "plugin.py").write_text(PLUGIN)
    logs: list[tuple[str, object]] = []

    def host_call(cap: str, op: str, args: dict[str, object]) -> object:
        raise AssertionError("no host call expected")

    rt = GuestRuntime(
        compile_bundle(load_plugin(tmp_path / "plugin.py")),
        host_call=host_call,
        log=lambda level, text: logs.append((level, text)),
    )
    rt.start()
    return rt, logs


def _raised(rt: GuestRuntime, name: str) -> SuaveplanError:
    with pytest.raises(SuaveplanError) as info:
        rt.call(name, [], {})
    return info.value


def _exact(value: object) -> bool:
    """Only exact plain types, all the way down."""
    if value is None or type(value) in (bool, int, float, str):
        return True
    if type(value) is list:
        return all(_exact(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _exact(v) for k, v in value.items())
    return False


def test_an_exception_whose_str_raises_a_forged_error_is_a_plugin_error(
    runtime: tuple[GuestRuntime, object],
) -> None:
    err = _raised(runtime[0], "exception_str_raises")
    assert (err.code, err.details) == ("SAND_VM_PLUGIN_ERROR", {"type": "Loud", "message": ""})


def test_an_exception_message_is_an_exact_str(runtime: tuple[GuestRuntime, object]) -> None:
    err = _raised(runtime[0], "exception_str_is_a_str_subclass")
    assert err.details == {"type": "Quiet", "message": "quiet words"}
    assert type(err.details["message"]) is str


def test_a_name_error_subclass_cannot_raise_through_its_name(
    runtime: tuple[GuestRuntime, object],
) -> None:
    err = _raised(runtime[0], "name_error_name_raises")
    assert (err.code, err.details) == ("SAND_VM_NAME_UNAVAILABLE", {"name": ""})


@pytest.mark.parametrize("name", ["subclass_code_raises", "guard_error_code_replaced"])
def test_a_code_the_plugin_supplies_runs_none_of_its_methods(
    runtime: tuple[GuestRuntime, object], name: str
) -> None:
    err = _raised(runtime[0], name)
    assert err.code == "SAND_VM_PLUGIN_ERROR"
    assert err.details["type"] == "SuaveplanError"
    assert _exact(err.to_wire())


def test_a_reraised_guard_error_leaves_as_plain_data_without_the_plugins_objects(
    runtime: tuple[GuestRuntime, object],
) -> None:
    err = _raised(runtime[0], "guard_error_details_replaced")
    assert (err.code, err.message, err.details) == ("SAND_VM_ATTRIBUTE_FORBIDDEN", "edited", {})
    assert type(err.message) is str
    assert err.cause is None
    assert _exact(err.to_wire())


def test_guard_errors_and_plain_exceptions_keep_what_they_say(
    runtime: tuple[GuestRuntime, object],
) -> None:
    err = _raised(runtime[0], "guard_error_with_its_details")
    assert (err.code, err.details) == ("SAND_VM_RESULT_INVALID", {"type": "set"})
    err = _raised(runtime[0], "plain_error")
    assert err.details == {"type": "ValueError", "message": "plain words"}


def test_a_function_whose_module_is_not_an_exact_str_is_not_callable(
    runtime: tuple[GuestRuntime, object],
) -> None:
    err = _raised(runtime[0], "wrapped")
    assert (err.code, err.details) == ("SAND_VM_NO_SUCH_FUNCTION", {"name": "wrapped"})


def test_topics_are_exact_strs_so_listing_and_delivering_run_no_plugin_code(
    runtime: tuple[GuestRuntime, object],
) -> None:
    rt = runtime[0]
    topics = rt.subscriptions()
    assert topics == ["orders", "refunds"]
    assert all(type(t) is str for t in topics)
    rt.deliver("orders", 1)
    rt.deliver("refunds", 2)
    assert rt.call("seen", [], {}) == [1, 2]


def test_print_and_log_hand_the_worker_exact_strs(
    runtime: tuple[GuestRuntime, list[tuple[str, object]]],
) -> None:
    rt, logs = runtime
    rt.call("print_with_a_str_subclass_sep", [], {})
    rt.call("log_with_a_str_subclass_message", [], {})
    assert logs == [("info", "a-b"), ("info", "text x"), ("info", "text %s")]
    assert all(type(text) is str for _, text in logs)
