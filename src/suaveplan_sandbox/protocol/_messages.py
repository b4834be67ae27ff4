"""Messages on the host/worker channel: frozen, slotted, keyword-only, validated on construction.

Each message has a one-letter-free wire tag (`TYPE`) and a plain-data field list; the frame
codec maps them to and from msgpack arrays `[tag, field, ...]`. Validation here is structural
(types and sizes); meaning (is this id pending? may this capability be called?) is the
host's job.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Final

MAX_NAME_LEN: Final = 256
MAX_LOG_TEXT: Final = 64 * 1024
LOG_LEVELS: Final = frozenset({"debug", "info", "warning", "error"})


def _check_id(value: object) -> None:
    if type(value) is not int or not 0 <= value < 2**63:
        raise ValueError("id must be a non-negative int below 2**63")


def _check_name(value: object, what: str) -> None:
    if type(value) is not str or not 0 < len(value) <= MAX_NAME_LEN:
        raise ValueError(f"{what} must be a non-empty str of at most {MAX_NAME_LEN} characters")


def _check_map(value: object, what: str) -> None:
    if type(value) is not dict or (value and not all(type(k) is str for k in value)):
        raise ValueError(f"{what} must be a dict with str keys")


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
        _check_name(self.digest, "digest")
        _check_map(self.bundle, "bundle")


@dataclass(frozen=True, slots=True, kw_only=True)
class Ready(Message):
    """Worker → host: hardening applied (its report's wire form), plugin started."""

    TYPE: ClassVar[str] = "ready"
    hardening: dict[str, object]
    subscriptions: list[str]

    def __post_init__(self) -> None:
        _check_map(self.hardening, "hardening")
        if type(self.subscriptions) is not list:
            raise ValueError("subscriptions must be a list")
        for topic in self.subscriptions:
            _check_name(topic, "topic")


@dataclass(frozen=True, slots=True, kw_only=True)
class Call(Message):
    """Host → worker: call plugin function `name`."""

    TYPE: ClassVar[str] = "call"
    id: int
    name: str
    args: list[object]
    kwargs: dict[str, object]

    def __post_init__(self) -> None:
        _check_id(self.id)
        _check_name(self.name, "name")
        if type(self.args) is not list:
            raise ValueError("args must be a list")
        _check_map(self.kwargs, "kwargs")


@dataclass(frozen=True, slots=True, kw_only=True)
class Result(Message):
    """Worker → host: call `id` returned `value`."""

    TYPE: ClassVar[str] = "result"
    id: int
    value: object

    def __post_init__(self) -> None:
        _check_id(self.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure(Message):
    """Worker → host: call `id` raised; `error` is `SuaveplanError.to_wire()` data."""

    TYPE: ClassVar[str] = "failure"
    id: int
    error: dict[str, object]

    def __post_init__(self) -> None:
        _check_id(self.id)
        _check_map(self.error, "error")


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCall(Message):
    """Worker → host: ask the gateway for `capability.operation(args)`."""

    TYPE: ClassVar[str] = "hostcall"
    id: int
    capability: str
    operation: str
    args: dict[str, object]

    def __post_init__(self) -> None:
        _check_id(self.id)
        _check_name(self.capability, "capability")
        _check_name(self.operation, "operation")
        _check_map(self.args, "args")


@dataclass(frozen=True, slots=True, kw_only=True)
class HostReply(Message):
    """Host → worker: host call `id` succeeded."""

    TYPE: ClassVar[str] = "hostreply"
    id: int
    value: object

    def __post_init__(self) -> None:
        _check_id(self.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostFailure(Message):
    """Host → worker: host call `id` failed with a coded error (wire form)."""

    TYPE: ClassVar[str] = "hostfailure"
    id: int
    error: dict[str, object]

    def __post_init__(self) -> None:
        _check_id(self.id)
        _check_map(self.error, "error")


@dataclass(frozen=True, slots=True, kw_only=True)
class Log(Message):
    """Worker → host: a guest log line (`print` and the logger)."""

    TYPE: ClassVar[str] = "log"
    level: str
    text: str

    def __post_init__(self) -> None:
        if self.level not in LOG_LEVELS:
            raise ValueError("unknown log level")
        if type(self.text) is not str or len(self.text) > MAX_LOG_TEXT:
            raise ValueError("log text must be a str of bounded length")


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
        _check_id(self.id)
        _check_name(self.topic, "topic")
        _check_name(self.subscription, "subscription")


MESSAGE_TYPES: Final[dict[str, type[Message]]] = {
    cls.TYPE: cls
    for cls in (Load, Ready, Call, Result, Failure, HostCall, HostReply, HostFailure, Log, Event)
}

FIELD_NAMES: Final[dict[type[Message], tuple[str, ...]]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in MESSAGE_TYPES.values()
}
