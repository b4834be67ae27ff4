"""The plugin manifest: loaded from a dict, JSON or TOML, validated by pydantic.

Every failure is one `SAND_MANIFEST_INVALID` error whose details list each problem with its
field path (`permissions.fs[1]`) and, for rule lists, the rule index. Rules are validated by
compiling them with the same matchers the checker uses, so a manifest that loads is a manifest
the checker can enforce.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal, final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError

from suaveplan_sandbox.errors import SuaveplanError, WireValue
from suaveplan_sandbox.permissions import _manifest_data
from suaveplan_sandbox.permissions._fetch_rules import FetchRuleError
from suaveplan_sandbox.permissions._fs_rules import FsRuleError
from suaveplan_sandbox.permissions._manifest_data import (
    MAX_MANIFEST_RULES,
    ManifestDataError,
    plain_manifest_data,
)
from suaveplan_sandbox.permissions._rule_cache import compiled_fetch_rules, compiled_fs_rules
from suaveplan_sandbox.permissions._table_names import RESERVED_TABLE_PREFIXES
from suaveplan_sandbox.permissions._topic_rules import validate_topic_rule

# A manifest file's size bound; a manifest given as data is held to it too (`_manifest_data`,
# where the other bounds are).
MAX_MANIFEST_BYTES: Final = _manifest_data.MAX_MANIFEST_BYTES
# At most this many problems are listed in `details.errors` (the rest are counted in
# `details.errors_omitted`): an error about ten thousand bad rules stays small.
MAX_MANIFEST_PROBLEMS: Final = 50
PLUGIN_NAME_PATTERN: Final = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
TABLE_PREFIX_PATTERN: Final = r"^[a-z][a-z0-9_]{0,30}_$"
SECRET_NAME_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$"  # noqa: S105 — a name pattern
# Control characters (Unicode category Cc: C0, DEL, C1) in the free-text fields. Both reach
# logs, terminals and databases: a NUL cannot be stored in PostgreSQL `text` (the migrations
# record takes the version), and an ESC sequence rewrites an operator's terminal. A
# description may still hold lines and tabs.
_VERSION_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_DESCRIPTION_CONTROL: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _no_control(value: str | None, pattern: re.Pattern[str], what: str) -> str | None:
    """`value` unchanged unless `pattern` finds a control character in it; then a ValueError
    naming the first one by code point (never the character itself)."""
    found = None if value is None else pattern.search(value)
    if found is not None:
        raise ValueError(f"{what} (U+{ord(found.group()):04X})")
    return value


def _relative_path(value: str | None, what: str) -> str | None:
    """`value` unchanged if it is a relative path without `..` or NUL; else a ValueError."""
    if value is None:
        return None
    path = Path(value)
    if not value or path.is_absolute() or ".." in path.parts or "\x00" in value:
        raise ValueError(f"{what}, without '..'")
    return value


class _RuleError(ValueError):
    """A rule list entry is bad; carries the index so the error path can name it."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.message = message


@final
class Budgets(_Strict):
    """Per-guest limits. Any dimension left out is not enforced (rlimits remain a backstop)."""

    cpu_percent: Annotated[StrictInt | StrictFloat, Field(gt=0, le=6400)] | None = Field(
        default=None, alias="cpuPercent"
    )
    memory_mb: Annotated[StrictInt, Field(gt=0, le=1024 * 1024)] | None = Field(
        default=None, alias="memoryMb"
    )
    wall_clock_ms: Annotated[StrictInt, Field(gt=0, le=24 * 3600 * 1000)] | None = Field(
        default=None, alias="wallClockMs"
    )


# A rule list: at most `MAX_MANIFEST_RULES` entries (also when a block is validated alone).
_Rules = Annotated[tuple[StrictStr, ...], Field(max_length=MAX_MANIFEST_RULES)]


@final
class PermissionsBlock(_Strict):
    fs: _Rules = ()
    fetch: _Rules = ()
    budgets: Budgets = Budgets()

    @field_validator("fs")
    @classmethod
    def _fs_rules_compile(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        try:
            compiled_fs_rules(rules)
        except FsRuleError as exc:
            raise _RuleError(exc.index, exc.message) from None
        return rules

    @field_validator("fetch")
    @classmethod
    def _fetch_rules_compile(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        try:
            compiled_fetch_rules(rules)
        except FetchRuleError as exc:
            raise _RuleError(exc.index, exc.message) from None
        return rules


@final
class DatabaseBlock(_Strict):
    table_prefix: Annotated[StrictStr, Field(pattern=TABLE_PREFIX_PATTERN)] = Field(
        alias="tablePrefix"
    )
    migrations: StrictStr | None = None

    @field_validator("table_prefix")
    @classmethod
    def _prefix_not_reserved(cls, value: str) -> str:
        if value.startswith(RESERVED_TABLE_PREFIXES):
            raise ValueError(
                "tablePrefix may not start with "
                + " or ".join(repr(p) for p in RESERVED_TABLE_PREFIXES)
                + " (the database engines' own tables)"
            )
        return value

    @field_validator("migrations")
    @classmethod
    def _migrations_relative(cls, value: str | None) -> str | None:
        return _relative_path(value, "migrations is a folder relative to the plugin")


@final
class SecretDecl(_Strict):
    name: Annotated[StrictStr, Field(pattern=SECRET_NAME_PATTERN)]


@final
class EventsBlock(_Strict):
    publishes: _Rules = ()
    subscribes: _Rules = ()

    @field_validator("publishes", "subscribes")
    @classmethod
    def _topics_valid(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        for index, rule in enumerate(rules):
            problem = validate_topic_rule(rule)
            if problem is not None:
                raise _RuleError(index, problem)
        return rules


@final
class Manifest(_Strict):
    """A validated plugin manifest. Field names follow the spec's camelCase on the wire."""

    name: Annotated[StrictStr, Field(pattern=PLUGIN_NAME_PATTERN)]
    version: StrictStr | None = None
    description: StrictStr | None = None
    kind: Literal["python", "wasm"] | None = None
    entry: StrictStr | None = None
    permissions: PermissionsBlock = PermissionsBlock()
    database: DatabaseBlock | None = None
    secrets: Annotated[tuple[SecretDecl, ...], Field(max_length=MAX_MANIFEST_RULES)] = ()
    events: EventsBlock = EventsBlock()

    @model_validator(mode="before")
    @classmethod
    def _plain_and_bounded(cls, data: object) -> object:
        """Whatever pydantic is given is first copied into plain, bounded data, and only the
        copy is validated (`_manifest_data`): the bounds hold on every route into a
        `Manifest`, and are judged before any rule is compiled."""
        return plain_manifest_data(data)

    @field_validator("secrets")
    @classmethod
    def _secret_names_unique(cls, decls: tuple[SecretDecl, ...]) -> tuple[SecretDecl, ...]:
        seen: set[str] = set()
        for index, decl in enumerate(decls):
            if decl.name in seen:
                raise _RuleError(index, "secret declared twice")
            seen.add(decl.name)
        return decls

    @field_validator("version")
    @classmethod
    def _version_printable(cls, value: str | None) -> str | None:
        return _no_control(value, _VERSION_CONTROL, "version holds a control character")

    @field_validator("description")
    @classmethod
    def _description_printable(cls, value: str | None) -> str | None:
        what = "description holds a control character other than tab, CR, LF"
        return _no_control(value, _DESCRIPTION_CONTROL, what)

    @field_validator("entry")
    @classmethod
    def _entry_relative(cls, value: str | None) -> str | None:
        return _relative_path(value, "entry is a path relative to the manifest")

    @property
    def table_prefix(self) -> str | None:
        return None if self.database is None else self.database.table_prefix

    @property
    def secret_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.secrets)

    def to_dict(self) -> dict[str, Any]:
        """The manifest as the camelCase mapping it was loaded from (defaults filled in)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _manifest_error(problems: list[dict[str, WireValue]], what: str) -> SuaveplanError:
    first = problems[0] if problems else {}
    details: dict[str, WireValue] = {"errors": list(problems[:MAX_MANIFEST_PROBLEMS])}
    if len(problems) > MAX_MANIFEST_PROBLEMS:
        details["errors_omitted"] = len(problems) - MAX_MANIFEST_PROBLEMS
    for key in ("path", "field", "index"):
        if key in first:
            details[key] = first[key]
    summary = "; ".join(f"{p.get('path', '?')}: {p.get('message', '')}" for p in problems[:5])
    return SuaveplanError("SAND_MANIFEST_INVALID", f"invalid manifest ({what}): {summary}", details)


def _problems(exc: PydanticValidationError) -> list[dict[str, WireValue]]:
    problems: list[dict[str, WireValue]] = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        field_path = _location(tuple(p for p in loc if not isinstance(p, int)))
        index: int | None = next((p for p in reversed(loc) if isinstance(p, int)), None)
        ctx = err.get("ctx") or {}
        cause = ctx.get("error")
        message = str(err["msg"])
        kind = str(err["type"])
        if isinstance(cause, ManifestDataError):
            loc = cause.loc
            field_path = _location(tuple(p for p in loc if not isinstance(p, int)))
            index = next((p for p in reversed(loc) if isinstance(p, int)), None)
            message = cause.message
            kind = cause.kind
        elif isinstance(cause, _RuleError):
            index = cause.index
            message = cause.message
            loc = (*loc, index)
        elif message.startswith("Value error, "):
            message = message.removeprefix("Value error, ")
        problem: dict[str, WireValue] = {
            "path": _location(loc),
            "field": field_path,
            "message": message,
            "type": kind,
        }
        if index is not None:
            problem["index"] = index
        problems.append(problem)
    return problems


def parse_manifest(data: object, *, source: str = "dict") -> Manifest:
    """Validate a manifest mapping. Raises `SAND_MANIFEST_INVALID` with field paths.

    A `Manifest` is validated again: pydantic's `model_construct` and `model_copy(update=)`
    make one without validation, and a name like `../x` or an absolute fs rule must not
    reach a policy (the name becomes a file name under a host's `data_dir`).

    A mapping is a `dict` (a subclass is read as the dict it stores, without calling its
    methods); another `Mapping` is refused, as is anything past the bounds in
    `_manifest_data` (`MAX_MANIFEST_RULES` entries in a list, `MAX_MANIFEST_BYTES` in all …),
    which are judged before anything else is."""
    if isinstance(data, Manifest):
        try:
            checked = Manifest.model_validate(
                data.model_dump(by_alias=True, round_trip=True, warnings=False)
            )
        except PydanticValidationError as exc:
            raise _manifest_error(_problems(exc), source) from None
        except Exception as exc:  # fields too broken to even dump
            problem: dict[str, WireValue] = {"path": "", "field": "", "message": str(exc)[:200]}
            raise _manifest_error([problem], source) from None
        return data if checked == data else checked
    if not isinstance(data, Mapping):
        raise _manifest_error(
            [{"path": "", "field": "", "message": "a manifest is a mapping"}], source
        )
    try:
        # Not `dict(data)`: that would run a dict subclass's own `keys` and `__getitem__`.
        return Manifest.model_validate(data)
    except PydanticValidationError as exc:
        raise _manifest_error(_problems(exc), source) from None


def _file_error(path: Path, reason: str, message: str) -> SuaveplanError:
    """A problem with the manifest file itself (no field to point at): code, file, reason."""
    return SuaveplanError(
        "SAND_MANIFEST_INVALID",
        f"manifest file {path}: {message}",
        {"file": str(path), "reason": reason, "errors": []},
    )


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are unique. JSON leaves duplicates undefined: Python keeps
    the last, other readers the first, so a reviewer's tool and the host could each see a
    different `permissions` block. TOML already refuses them."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key[:40]!r}")
        out[key] = value
    return out


def _read_regular_file(path: Path) -> bytes:
    """At most `MAX_MANIFEST_BYTES + 1` bytes of `path`, which must be a regular file.

    A FIFO would block `open` until a writer came (for ever), a terminal would become the
    host's controlling terminal, and a device's driver would run: only a regular file is
    opened (looked at first, non-blocking and without a controlling terminal, and checked
    again once open, for an entry swapped in between)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise _file_error(path, "unreadable", "cannot read it (not a regular file)")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _file_error(path, "unreadable", "cannot read it (not a regular file)")
            return fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise _file_error(path, "unreadable", f"cannot read it ({why})") from exc


def load_manifest(source: Mapping[str, object] | Manifest | str | os.PathLike[str]) -> Manifest:
    """Load a manifest from a mapping, or a `.json` / `.toml` file.

    A problem with the file itself raises `SAND_MANIFEST_INVALID` with `details.file` and
    `details.reason` (`unreadable`, `too-large`, `unsupported-suffix`, `unparsable`,
    `not-a-mapping`) and an empty `details.errors`; a problem inside it names field paths.
    """
    if not isinstance(source, str | os.PathLike):
        return parse_manifest(source)
    text = os.fspath(source)
    if not isinstance(text, str):  # an os.PathLike[bytes]
        problem: dict[str, WireValue] = {
            "path": "",
            "field": "",
            "message": "a manifest path is a str or os.PathLike[str]",
        }
        raise _manifest_error([problem], "path")
    path = Path(text)
    if path.suffix not in (".toml", ".json"):
        shown = repr(path.suffix) if path.suffix else "no suffix"
        raise _file_error(
            path, "unsupported-suffix", f"has {shown}; a manifest is a .toml or .json file"
        )
    if "\x00" in text:
        raise _file_error(path, "unreadable", "cannot read it (the path holds a NUL byte)")
    raw = _read_regular_file(path)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise _file_error(path, "too-large", "is larger than 1 MiB")
    kind = "TOML" if path.suffix == ".toml" else "JSON"
    try:
        text = raw.decode("utf-8")
        data: object = (
            tomllib.loads(text)
            if path.suffix == ".toml"
            else json.loads(text, object_pairs_hook=_unique_keys)
        )
    except (ValueError, UnicodeDecodeError) as exc:
        raise _file_error(path, "unparsable", f"is not valid {kind}: {exc}"[:300]) from None
    except RecursionError:
        # Both parsers recurse per level: `[[[[…` within the size bound exhausts the stack.
        raise _file_error(path, "unparsable", f"is not valid {kind}: nested too deeply") from None
    if not isinstance(data, Mapping):
        raise _file_error(
            path, "not-a-mapping", f"holds a {type(data).__name__}; a manifest is an object"
        )
    return parse_manifest(data, source=path.name)
