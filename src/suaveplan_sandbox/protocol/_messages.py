"""Messages on the host/worker channel: frozen, slotted, keyword-only, validated on construction.

Each message has a one-letter-free wire tag (`TYPE`) and a plain-data field list; the frame
codec maps them to and from msgpack arrays `[tag, field, ...]`. Validation here is structural
(types and sizes); meaning (is this id pending? may this capability be called?) is the
host's job.

Each class's rules live in one positional check function (`CHECKS`, fields in wire order):
`__post_init__` runs it, and so does the frame decoder, which then builds the instance
without the keyword constructor (the hot path of every call). One rule set, two entry
points, so a decoded message is exactly one the constructor would have accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import ClassVar, Final

MAX_NAME_LEN: Final = 256
MAX_LOG_TEXT: Final = 64 * 1024
LOG_LEVELS: Final = frozenset({"debug", "info", "warning", "error"})


_ID_ERROR: Final = "id must be a non-negative int below 2**63"


def _check_id(value: object) -> None:
    if type(value) is not int or not 0 <= value < 2**63:
        raise ValueError(_ID_ERROR)


def _name_ok(value: object) -> bool:
    return type(value) is str and 0 < len(value) <= MAX_NAME_LEN


def _check_name(value: object, what: str) -> None:
    if not _name_ok(value):
        raise ValueError(f"{what} must be a non-empty str of at most {MAX_NAME_LEN} characters")


def _map_ok(value: object) -> bool:
    if type(value) is not dict:
        return False
    for key in value:  # noqa: SIM110 - a loop, not all(...): no generator per message
        if type(key) is not str:
            return False
    return True


def _check_map(value: object, what: str) -> None:
    if not _map_ok(value):
        raise ValueError(f"{what} must be a dict with str keys")


# The checks below run for every frame; the hot ones test the common case inline (no call)
# and fall back to the named checks only to raise their error.


def _check_load(digest: object, bundle: object) -> None:
    _check_name(digest, "digest")
    _check_map(bundle, "bundle")


def _check_hardened(hardening: object) -> None:
    _check_map(hardening, "hardening")


def _check_ready(subscriptions: object) -> None:
    if type(subscriptions) is not list:
        raise ValueError("subscriptions must be a list")
    for topic in subscriptions:
        _check_name(topic, "topic")


def _check_call(id: object, name: object, args: object, kwargs: object) -> None:
    if type(id) is not int or not 0 <= id < 2**63:
        raise ValueError(_ID_ERROR)
    if type(name) is not str or not 0 < len(name) <= MAX_NAME_LEN:
        _check_name(name, "name")
    if type(args) is not list:
        raise ValueError("args must be a list")
    if type(kwargs) is not dict or (kwargs and not _map_ok(kwargs)):
        raise ValueError("kwargs must be a dict with str keys")


def _check_reply(id: object, value: object) -> None:
    """`Result` and `HostReply`: any plain value (msgpack produced it)."""
    if type(id) is not int or not 0 <= id < 2**63:
        raise ValueError(_ID_ERROR)


def _check_error(id: object, error: object) -> None:
    """`Failure` and `HostFailure`: an error map (`SuaveplanError.to_wire()` data)."""
    if type(id) is not int or not 0 <= id < 2**63:
        raise ValueError(_ID_ERROR)
    _check_map(error, "error")


def _check_hostcall(id: object, capability: object, operation: object, args: object) -> None:
    if type(id) is not int or not 0 <= id < 2**63:
        raise ValueError(_ID_ERROR)
    if type(capability) is not str or not 0 < len(capability) <= MAX_NAME_LEN:
        _check_name(capability, "capability")
    if type(operation) is not str or not 0 < len(operation) <= MAX_NAME_LEN:
        _check_name(operation, "operation")
    if not _map_ok(args):
        raise ValueError("args must be a dict with str keys")


def _check_log(level: object, text: object) -> None:
    if level not in LOG_LEVELS:
        raise ValueError("unknown log level")
    if type(text) is not str or len(text) > MAX_LOG_TEXT:
        raise ValueError("log text must be a str of bounded length")


def _check_event(id: object, topic: object, subscription: object, payload: object) -> None:
    if type(id) is not int or not 0 <= id < 2**63:
        raise ValueError(_ID_ERROR)
    _check_name(topic, "topic")
    _check_name(subscription, "subscription")


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """Base of all channel messages."""

    TYPE: ClassVar[str] = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Load(Message):
    """Host → zygote/worker: a plugin bundle (its `to_wire()` form), keyed by digest."""

    TYPE: ClassVar[str] = "load"
    digest: str
    bundle: dict[str, object]

    def __post_init__(self) -> None:
        _check_load(self.digest, self.bundle)


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardened(Message):
    """Worker → host: hardening applied (its report's wire form), sent before any plugin
    code runs, so the report is the worker's own and not something plugin code could have
    written after escaping the interpreter."""

    TYPE: ClassVar[str] = "hardened"
    hardening: dict[str, object]

    def __post_init__(self) -> None:
        _check_hardened(self.hardening)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ready(Message):
    """Worker → host: the plugin's module code ran; it subscribed to `subscriptions`."""

    TYPE: ClassVar[str] = "ready"
    subscriptions: list[str]

    def __post_init__(self) -> None:
        _check_ready(self.subscriptions)


@dataclass(frozen=True, slots=True, kw_only=True)
class Call(Message):
    """Host → worker: call plugin function `name`."""

    TYPE: ClassVar[str] = "call"
    id: int
    name: str
    args: list[object]
    kwargs: dict[str, object]

    def __post_init__(self) -> None:
        _check_call(self.id, self.name, self.args, self.kwargs)


@dataclass(frozen=True, slots=True, kw_only=True)
class Result(Message):
    """Worker → host: call `id` returned `value`."""

    TYPE: ClassVar[str] = "result"
    id: int
    value: object

    def __post_init__(self) -> None:
        _check_reply(self.id, self.value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure(Message):
    """Worker → host: call `id` raised; `error` is `SuaveplanError.to_wire()` data."""

    TYPE: ClassVar[str] = "failure"
    id: int
    error: dict[str, object]

    def __post_init__(self) -> None:
        _check_error(self.id, self.error)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCall(Message):
    """Worker → host: ask the gateway for `capability.operation(args)`."""

    TYPE: ClassVar[str] = "hostcall"
    id: int
    capability: str
    operation: str
    args: dict[str, object]

    def __post_init__(self) -> None:
        _check_hostcall(self.id, self.capability, self.operation, self.args)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostReply(Message):
    """Host → worker: host call `id` succeeded."""

    TYPE: ClassVar[str] = "hostreply"
    id: int
    value: object

    def __post_init__(self) -> None:
        _check_reply(self.id, self.value)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostFailure(Message):
    """Host → worker: host call `id` failed with a coded error (wire form)."""

    TYPE: ClassVar[str] = "hostfailure"
    id: int
    error: dict[str, object]

    def __post_init__(self) -> None:
        _check_error(self.id, self.error)


@dataclass(frozen=True, slots=True, kw_only=True)
class Log(Message):
    """Worker → host: a guest log line (`print` and the logger)."""

    TYPE: ClassVar[str] = "log"
    level: str
    text: str

    def __post_init__(self) -> None:
        _check_log(self.level, self.text)


@dataclass(frozen=True, slots=True, kw_only=True)
class Event(Message):
    """Host → worker: delivery `id` of `payload` on `topic` to the handlers of `subscription`.

    `subscription` is the pattern the plugin subscribed with (its handlers are keyed by it);
    `topic` is the published topic the host checked. The worker answers with `Result`/`Failure`
    of the same id, so a delivery is timed and budgeted like a call.
    """

    TYPE: ClassVar[str] = "event"
    id: int
    topic: str
    subscription: str
    payload: object

    def __post_init__(self) -> None:
        _check_event(self.id, self.topic, self.subscription, self.payload)


MESSAGE_TYPES: Final[dict[str, type[Message]]] = {
    cls.TYPE: cls
    for cls in (
        Load,
        Hardened,
        Ready,
        Call,
        Result,
        Failure,
        HostCall,
        HostReply,
        HostFailure,
        Log,
        Event,
    )
}

FIELD_NAMES: Final[dict[type[Message], tuple[str, ...]]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in MESSAGE_TYPES.values()
}

CHECKS: Final[dict[type[Message], Callable[..., None]]] = {
    Load: _check_load,
    Hardened: _check_hardened,
    Ready: _check_ready,
    Call: _check_call,
    Result: _check_reply,
    Failure: _check_error,
    HostCall: _check_hostcall,
    HostReply: _check_reply,
    HostFailure: _check_error,
    Log: _check_log,
    Event: _check_event,
}
"""Each class's field rules, positional in `FIELD_NAMES` order (`__post_init__` runs the same)."""
