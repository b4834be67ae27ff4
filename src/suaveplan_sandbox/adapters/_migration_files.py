"""Reading a plugin's migration files on the host.

The folder and its `*.sql` files come with the plugin, so they are the author's: like the VM
loader reading sources, the host reads only regular files that are not links (a link would
have the host run, and quote in errors, a file of its own), never blocks on a FIFO or device,
and stops past a size bound. Every failure is `SAND_DB_MIGRATION_FAILED` naming the file and a
reason, never its content.

The folder itself must not be a link either (`details={"migrations": folder, "reason":
"symlink"}`): a plugin shipping `migrations -> /srv/host/sql` would otherwise have the host run
its own SQL as the plugin's. It is opened afresh, without following a link, for every file
read, and the file is read relative to that descriptor, so a folder swapped for a link after
it was listed is refused too. Given the plugin's root (`migration_files(..., root=)`, what
`standard_adapters` passes), every component from the root down is checked the same way, so a
`migrations = "db/migrations"` whose `db` is a link is refused as well, and so is a linked
folder holding no `*.sql` file; the root itself is the host's path, and may hold links the
host made. Without it only the folder's own name is checked.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Final

from suaveplan_sandbox._untrusted_files import UnreadableFile, read_regular_file
from suaveplan_sandbox.adapters._beneath import (
    DIR_FLAGS,
    open_component,
    open_directory,
    openat2_available,
)
from suaveplan_sandbox.errors import SuaveplanError

MAX_MIGRATION_BYTES: Final = 4 * 1024 * 1024


def migration_files(
    migrations_dir: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> list[Path]:
    """The folder's `*.sql` files in name order (none when there is no such folder).

    With `root`, the folder must lie beneath it (`details.reason` `outside-root`) and no
    component from `root` down may be a link (`symlink`), or it is `SAND_DB_MIGRATION_FAILED`
    naming the folder; a component that cannot be opened otherwise is `unreadable`."""
    folder = Path(migrations_dir)
    if root is not None:
        try:
            parts = folder.relative_to(root).parts
        except ValueError:
            raise _folder_unusable(folder, "outside-root") from None
        try:
            top = os.open(root, DIR_FLAGS & ~os.O_NOFOLLOW)  # the host's own path
        except FileNotFoundError:
            return []
        except OSError:
            raise _folder_unusable(folder, "unreadable") from None
        try:
            os.close(open_directory(top, parts, use_openat2=openat2_available()))
        except (FileNotFoundError, NotADirectoryError):
            return []  # no such folder (or a file by its name): nothing to apply, as before
        except OSError as exc:
            reason = "symlink" if exc.errno == errno.ELOOP else "unreadable"
            raise _folder_unusable(folder, reason) from None
        finally:
            os.close(top)
    return sorted(folder.glob("*.sql"), key=lambda p: p.name)


def read_migration(file: Path) -> str:
    """The text of one migration file, or `SAND_DB_MIGRATION_FAILED` with `details.reason`
    `symlink`, `not-a-regular-file`, `too-large`, `not-utf8` or `unreadable`
    (`details.migration` naming the file), or, when its folder is a link or cannot be
    opened, `symlink` or `unreadable` with `details.migrations` naming the folder."""
    try:
        folder = open_component(None, file.parent, DIR_FLAGS | os.O_NONBLOCK)
    except OSError as exc:
        raise _folder_unusable(
            file.parent, "symlink" if exc.errno == errno.ELOOP else "unreadable"
        ) from None
    try:
        data = read_regular_file(file.name, MAX_MIGRATION_BYTES, dir_fd=folder)
    except UnreadableFile as exc:
        raise _unreadable(file, exc.reason) from None
    finally:
        os.close(folder)
    if len(data) > MAX_MIGRATION_BYTES:
        raise _unreadable(file, "too-large")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _unreadable(file, "not-utf8") from None


def _shown(name: str) -> str:
    return os.fsencode(name).decode("utf-8", "replace")


def _unreadable(file: Path, reason: str) -> SuaveplanError:
    return SuaveplanError(
        "SAND_DB_MIGRATION_FAILED",
        "a migration file cannot be read",
        {"migration": _shown(file.name), "reason": reason},
    )


def _folder_unusable(folder: Path, reason: str) -> SuaveplanError:
    return SuaveplanError(
        "SAND_DB_MIGRATION_FAILED",
        "the migrations folder cannot be used",
        {"migrations": _shown(folder.name), "reason": reason},
    )
