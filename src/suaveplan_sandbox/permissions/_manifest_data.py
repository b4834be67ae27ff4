"""A manifest given as data is copied into plain, bounded data before anything else reads it.

Each field has its own bound (an fs rule's 4,096 bytes, a topic's 256 characters), but those
run only once pydantic has taken the whole input apart and the rules have been compiled: a
million fs rules or a 100 MB description would cost the host first. So the input is walked
once, iteratively, and copied: only then do pydantic and the rule compilers see it, and only
the copy. The walk refuses, without echoing the value:

- a type that is not plain data: a `dict`, `list` or `tuple` (or a subclass of one, which is
  read through the built-in type's own storage: its overridden `__iter__`, `__getitem__`,
  `__len__`, `items` … never run, and it cannot show the check one thing and pydantic
  another), and an exact `str`, `int`, `float`, `bool` or None leaf; TOML's dates and times
  pass through for their field to refuse. A `str` subclass, another `Mapping`, a set or a
  generator is refused without a method of it being called;
- more than `MAX_MANIFEST_KEYS` keys in a mapping or `MAX_MANIFEST_RULES` entries in a list;
- a key that is not a `str` of at most `MAX_MANIFEST_KEY_BYTES`, a string longer than
  `MAX_MANIFEST_STRING_BYTES` (judged by its length before it is encoded), and a string
  that is not valid UTF-8 (a lone surrogate such as `"\\ud800"`, which JSON's escapes and
  Python strings can hold and no file name, log line or JSON reader can);
- nesting deeper than `MAX_MANIFEST_DEPTH` (a dict that contains itself included);
- more than `MAX_MANIFEST_BYTES` in all, measured as every string's UTF-8 bytes plus one per
  entry: never more than the manifest's compact JSON, so a dict is held to the bound a
  manifest file is.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Final, cast

# A manifest file may be at most this large; a manifest given as data is measured against it.
MAX_MANIFEST_BYTES: Final = 1024 * 1024
# Entries in any one list: fs and fetch rules, secrets, published and subscribed topics.
# Real plugins declare tens; the benchmarks build policies of 10,000 rules.
MAX_MANIFEST_RULES: Final = 10_000
# Keys in any one mapping: the widest the schema has is the manifest's own nine.
MAX_MANIFEST_KEYS: Final = 32
# A key: the longest the schema has is 11 characters (`wallClockMs`).
MAX_MANIFEST_KEY_BYTES: Final = 64
# Any string: above every field's own bound (an fs rule is at most `rw:` and 4,096 bytes), so
# that bound still says why a rule is refused; it caps the fields that have none.
MAX_MANIFEST_STRING_BYTES: Final = 8192
# Mappings and lists inside each other: the schema needs three (`permissions.budgets.*`,
# `secrets[0].name`).
MAX_MANIFEST_DEPTH: Final = 8

# Compared by identity: a set lookup would hash the type, and a metaclass can define that.
_LEAVES: Final = (int, float, bool, type(None), datetime.date, datetime.datetime, datetime.time)

Location = tuple[str | int, ...]


class ManifestDataError(ValueError):
    """Manifest data outside the bounds or not plain: where (`loc`), a `kind` code for
    `details.errors[].type`, and a message that never holds the value."""

    def __init__(self, loc: Location, kind: str, message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.kind = kind
        self.message = message


def _container_entries(value: object) -> tuple[int, Iterable[tuple[object, object]]] | None:
    """(entry count, (key or index, item) pairs) read through the built-in storage of a
    dict, list or tuple (subclasses too: no overridden method runs), or None if `value`
    is not one."""
    kind = type(value)
    if issubclass(kind, dict):
        mapping = cast(dict[object, object], value)
        return dict.__len__(mapping), dict.items(mapping)
    if issubclass(kind, list):
        items = cast(list[object], value)
        return list.__len__(items), enumerate(list.__iter__(items))
    if issubclass(kind, tuple):
        row = cast(tuple[object, ...], value)
        return tuple.__len__(row), enumerate(tuple.__iter__(row))
    return None


def _utf8_length(text: str, limit: int, loc: Location) -> int:
    """`text`'s UTF-8 length, refused if it is over `limit` or has no UTF-8 encoding."""
    if len(text) > limit:  # a character is at least one byte: no need to encode
        raise ManifestDataError(loc, "string_too_long", f"strings are at most {limit} bytes")
    if text.isascii():
        return len(text)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ManifestDataError(
            loc, "string_not_utf8", "strings are valid UTF-8 (no lone surrogates)"
        ) from None
    if size > limit:
        raise ManifestDataError(loc, "string_too_long", f"strings are at most {limit} bytes")
    return size


def _not_plain(loc: Location) -> ManifestDataError:
    return ManifestDataError(
        loc,
        "not_plain_data",
        "a manifest is plain data: dict, list, tuple, str, int, float, bool or None",
    )


_Copy = dict[str, object] | list[object]
# (source container, its copy, where it is, how deep it is)
_Pending = list[tuple[object, _Copy, Location, int]]


def _copy_of(value: object, where: Location, depth: int, pending: _Pending) -> tuple[object, int]:
    """(`value` as plain data, its size): a leaf as it is, a container as an empty copy
    queued to be filled."""
    kind = type(value)
    if kind is str:
        return value, _utf8_length(cast(str, value), MAX_MANIFEST_STRING_BYTES, where)
    if any(kind is leaf for leaf in _LEAVES):
        return value, 0
    if not issubclass(kind, dict | list | tuple):
        raise _not_plain(where)
    if depth >= MAX_MANIFEST_DEPTH:
        raise ManifestDataError(
            where,
            "manifest_too_deep",
            f"mappings and lists nest at most {MAX_MANIFEST_DEPTH} deep",
        )
    copy: _Copy = {} if issubclass(kind, dict) else []
    pending.append((value, copy, where, depth + 1))
    return copy, 0


def plain_manifest_data(data: object) -> dict[str, object]:
    """A plain copy of the manifest mapping `data`, or `ManifestDataError` (see the module)."""
    if not issubclass(type(data), dict):
        raise _not_plain(())
    budget = MAX_MANIFEST_BYTES
    root: dict[str, object] = {}
    # One container at a time, no recursion; each copy is in its parent before it is filled.
    pending: _Pending = [(data, root, (), 1)]
    while pending:
        source, copy, loc, depth = pending.pop()
        found = _container_entries(source)
        if found is None:  # cannot happen: only containers are queued
            raise _not_plain(loc)
        count, entries = found
        most = MAX_MANIFEST_KEYS if isinstance(copy, dict) else MAX_MANIFEST_RULES
        if count > most:
            what = "keys" if isinstance(copy, dict) else "entries"
            raise ManifestDataError(loc, "too_long", f"at most {most} {what} here")
        for key, value in entries:
            budget -= 1
            if isinstance(copy, dict):
                if type(key) is not str:
                    raise _not_plain(loc)
                # A bad key is not named: the problem points at its mapping.
                budget -= _utf8_length(key, MAX_MANIFEST_KEY_BYTES, loc)
                item, size = _copy_of(value, (*loc, key), depth, pending)
                copy[key] = item
            else:
                item, size = _copy_of(value, (*loc, cast(int, key)), depth, pending)
                copy.append(item)
            budget -= size
            if budget < 0:
                raise ManifestDataError(
                    (), "manifest_too_large", f"a manifest is at most {MAX_MANIFEST_BYTES} bytes"
                )
    return root
