"""Secrets backends: an explicit environment mapping, a static dict, a mounted directory.

Values never appear in `repr`, errors or logs: errors name the code only (the declared name
is the guest's own and already known to it, but we keep it out of messages anyway).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final, final

from suaveplan_sandbox.adapters._fs import BeneathRootFs
from suaveplan_sandbox.errors import SuaveplanError

_MAX_SECRET_BYTES: Final = 64 * 1024


def _unavailable(cause: BaseException | None = None) -> SuaveplanError:
    return SuaveplanError(
        "SAND_SECRET_UNAVAILABLE", "the secret is declared but has no value", cause=cause
    )


@final
class EnvSecrets:
    """Secret name → environment variable, explicitly; the rest of the environment is unseen."""

    def __init__(self, mapping: Mapping[str, str], *, environ: Mapping[str, str] | None = None):
        self._mapping = dict(mapping)
        self._environ = environ if environ is not None else os.environ

    def __repr__(self) -> str:
        return f"EnvSecrets(names={sorted(self._mapping)!r})"

    async def get(self, name: str) -> str:
        var = self._mapping.get(name)
        if var is None:
            raise _unavailable()
        value = self._environ.get(var)
        if value is None:
            raise _unavailable()
        return value


@final
class StaticSecrets:
    """A fixed mapping of secret values (configuration loaded by the host)."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = dict(values)

    def __repr__(self) -> str:
        return f"StaticSecrets(names={sorted(self._values)!r})"

    async def get(self, name: str) -> str:
        try:
            return self._values[name]
        except KeyError:
            raise _unavailable() from None


@final
class DirectorySecrets:
    """One file per secret name, as Kubernetes and Docker mount them.

    Kubernetes publishes `name -> ..data/name` and `..data -> ..2024_…` symlinks inside the
    mount; those two hops are resolved by hand and must stay inside the directory. Any other
    link, a name with `/`, a leading `.`, or a file over 64 KiB is unavailable.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)

    def __repr__(self) -> str:
        return f"DirectorySecrets(path={str(self._path)!r})"

    def _read_sync(self, name: str) -> str:
        if not name or "/" in name or "\0" in name or name.startswith("."):
            raise _unavailable()
        fs = BeneathRootFs(self._path, max_read_bytes=_MAX_SECRET_BYTES)
        try:
            target = name
            entry = self._path / name
            if entry.is_symlink():
                # Kubernetes layout: name -> ..data/name, ..data -> ..<timestamp>
                link = str(entry.readlink())
                if link != f"..data/{name}":
                    raise _unavailable()
                data_link = str((self._path / "..data").readlink())
                if "/" in data_link or not data_link.startswith(".."):
                    raise _unavailable()
                target = f"{data_link}/{name}"
            raw = fs._read_sync(target, _MAX_SECRET_BYTES)
        except SuaveplanError as exc:
            raise _unavailable(exc) from None
        except OSError as exc:
            raise _unavailable(exc) from None
        finally:
            fs.close()
        try:
            return raw.decode("utf-8").rstrip("\n")
        except UnicodeDecodeError:
            pass
        # Raised outside the handler: a UnicodeDecodeError holds the raw value (`.object`),
        # and as the error's `__context__` it would travel with it (`from None` only hides it
        # from tracebacks; `repr(err.__context__)` would still show the bytes).
        raise _unavailable()

    async def get(self, name: str) -> str:
        return await asyncio.to_thread(self._read_sync, name)
