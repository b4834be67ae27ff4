# Stub for the optional C accelerator (`_speedups.c`); `permissions._accel` loads it.
from collections.abc import Callable
from typing import Final

from suaveplan_sandbox.permissions._decision import Allow, Deny, DenyReason

MAX_FAST: Final[int]

_FsEntry = tuple[int, Callable[[str], object] | None, bool, str]
_FetchEntry = tuple[int, int | None, bool, str]

class FsMatcher:
    def __init__(
        self,
        *,
        exact: dict[str, tuple[_FsEntry, ...]],
        globs: dict[str, tuple[_FsEntry, ...]],
        root_globs: bool,
        first_glob: int,
        read_cache: dict[str, Allow | Deny],
        write_cache: dict[str, Allow | Deny],
        denials: dict[DenyReason, Deny],
        deny_mode: Deny,
        deny_outside: Deny,
        deny_invalid: Deny,
        allow_type: type[Allow],
        normalize: object,
        cache_entries: int,
        cached_chars: int,
    ) -> None: ...
    def check(self, path: object, mode: object = "read") -> Allow | Deny: ...

class FetchMatcher:
    def __init__(
        self,
        *,
        exact: dict[str, tuple[_FetchEntry, ...]],
        suffix: dict[str, tuple[_FetchEntry, ...]],
        suffix_labels: frozenset[int],
        cache: dict[str, Allow | Deny],
        deny_invalid: Deny,
        deny_scheme: Deny,
        deny_host: Deny,
        allow_type: type[Allow],
        cache_entries: int,
        cached_chars: int,
    ) -> None: ...
    def check(self, url: object) -> Allow | Deny: ...

def bind_ada(path: str) -> int: ...
def read_cached(
    root_fd: int,
    path: bytes,
    limit: int,
    rwf: int,
    path_flags: int,
    read_flags: int,
    resolve: int,
) -> bytes | None: ...
def poll_recv(fd: int, buffer: bytearray, deadline: float) -> int: ...
