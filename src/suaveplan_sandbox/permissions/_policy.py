"""`PermissionPolicy`: the manifest's rules, verbatim, with every matcher compiled up front."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, final

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions._fetch_rules import FetchRuleSet
from suaveplan_sandbox.permissions._fs_rules import FsRuleSet
from suaveplan_sandbox.permissions._manifest import Budgets, Manifest, load_manifest
from suaveplan_sandbox.permissions._rule_cache import compiled_fetch_rules, compiled_fs_rules
from suaveplan_sandbox.permissions._sql_gate import DEFAULT_MAX_SQL_LENGTH, SqlGate
from suaveplan_sandbox.permissions._topic_rules import TopicRuleSet

SqlDialect = Literal["sqlite", "postgres"]


def _invalid(argument: str, message: str, value: object) -> SuaveplanError:
    return SuaveplanError(
        "SAND_INVALID_ARGUMENT", message, {"argument": argument, "type": type(value).__name__}
    )


def _root_path(root: object) -> Path:
    """`root` as an absolute path. An empty one would silently mean the current directory,
    and one with NUL can name no directory: both are refused, as is anything not a `str`
    path (a bytes path, an int, None)."""
    text = os.fspath(root) if isinstance(root, str | os.PathLike) else None
    if not isinstance(text, str) or not text or "\x00" in text:
        raise _invalid("root", "root is a non-empty str or os.PathLike path without NUL", root)
    return Path(text).absolute()


@final
class PermissionPolicy:
    """What one plugin may touch. Immutable; built only from a manifest.

    `root` is the directory the plugin's filesystem rules are relative to (the plugin sees it
    as `/`). `sql_dialect` is the host's database dialect, not the plugin's choice.
    """

    __slots__ = (
        "_budgets",
        "_fetch",
        "_fs",
        "_manifest",
        "_publishes",
        "_root",
        "_sql",
        "_subscribes",
    )

    def __init__(
        self,
        manifest: Manifest,
        *,
        root: Path,
        sql_dialect: SqlDialect,
        max_sql_length: int = DEFAULT_MAX_SQL_LENGTH,
    ) -> None:
        self._manifest = manifest
        self._root = root
        # Validation already compiled these; the cache hands back the same immutable sets.
        self._fs = compiled_fs_rules(manifest.permissions.fs)
        self._fetch = compiled_fetch_rules(manifest.permissions.fetch)
        self._sql = SqlGate(
            manifest.table_prefix, dialect=sql_dialect, max_sql_length=max_sql_length
        )
        self._publishes = TopicRuleSet(manifest.events.publishes)
        self._subscribes = TopicRuleSet(manifest.events.subscribes)
        self._budgets = manifest.permissions.budgets

    @classmethod
    def from_manifest(
        cls,
        manifest: Manifest | Mapping[str, object] | str | os.PathLike[str],
        *,
        root: str | os.PathLike[str],
        sql_dialect: SqlDialect = "sqlite",
        max_sql_length: int = DEFAULT_MAX_SQL_LENGTH,
    ) -> PermissionPolicy:
        """Build a policy. Raises `SAND_MANIFEST_INVALID` for a bad manifest, and
        `SAND_INVALID_ARGUMENT` (`details.argument`) for a bad `root`, `sql_dialect` or
        `max_sql_length`.

        `root`: a non-empty `str` or `os.PathLike[str]` without NUL; a relative one is made
        absolute against the current directory now. Nothing is read here: whether it is a
        directory is the adapters' concern (`open_standard_adapters`, the WASM preopens).
        `max_sql_length`: the longest runtime SQL text (characters) the gate will parse; a
        longer statement is denied before parsing, which runs on the caller's thread."""
        if not isinstance(sql_dialect, str) or sql_dialect not in ("sqlite", "postgres"):
            raise _invalid("sql_dialect", "sql_dialect is 'sqlite' or 'postgres'", sql_dialect)
        if type(max_sql_length) is not int or max_sql_length <= 0:
            raise _invalid("max_sql_length", "max_sql_length is an int > 0", max_sql_length)
        return cls(
            load_manifest(manifest),
            root=_root_path(root),
            sql_dialect=sql_dialect,
            max_sql_length=max_sql_length,
        )

    def __repr__(self) -> str:
        return f"PermissionPolicy(plugin={self.plugin!r}, root={str(self._root)!r})"

    @property
    def manifest(self) -> Manifest:
        return self._manifest

    @property
    def plugin(self) -> str:
        return self._manifest.name

    @property
    def root(self) -> Path:
        return self._root

    @property
    def fs_rules(self) -> tuple[str, ...]:
        return self._fs.rules

    @property
    def fetch_rules(self) -> tuple[str, ...]:
        return self._fetch.rules

    @property
    def table_prefix(self) -> str | None:
        return self._manifest.table_prefix

    @property
    def secrets(self) -> tuple[str, ...]:
        return self._manifest.secret_names

    @property
    def publishes(self) -> tuple[str, ...]:
        return self._publishes.rules

    @property
    def subscribes(self) -> tuple[str, ...]:
        return self._subscribes.rules

    @property
    def budgets(self) -> Budgets:
        return self._budgets

    @property
    def sql_dialect(self) -> str:
        return self._sql.dialect

    # Compiled matchers, for hosts (the WASM host reads `fs.preopens()`).
    @property
    def fs(self) -> FsRuleSet:
        return self._fs

    @property
    def fetch(self) -> FetchRuleSet:
        return self._fetch

    @property
    def sql(self) -> SqlGate:
        return self._sql

    @property
    def publish_rules(self) -> TopicRuleSet:
        return self._publishes

    @property
    def subscribe_rules(self) -> TopicRuleSet:
        return self._subscribes
