"""Modules the allowlisted standard library imports only when first used.

A worker under Landlock cannot read module files, so anything imported after the fork fails
with `PermissionError` deep inside an allowed call. Three kinds of import happen late:

* inside a function of an allowlisted module (`collections.Counter.most_common` imports
  `heapq`, `urllib.parse` imports `unicodedata` for a non-ASCII host);
* from C, on behalf of the calling frame (`datetime.strptime` imports `_strptime`;
  `strftime` and `timetuple` import `time`). CPython's `PyImport_Import` calls the
  `__import__` of the *calling frame's* builtins, which for plugin code is the guest's
  guarded import, then takes the module from `sys.modules` and discards what `__import__`
  returned; so the guarded import lets exactly these names pass, returning nothing the
  plugin could use, once the fork server has imported them;
* codec lookups (`str.encode("cp1252")`, `bytes.decode("shift_jis")`): the `encodings`
  search function imports the codec's module the first time its name is asked for.

The fork server imports all of these before any fork (about 60 ms and 4 MB, shared
copy-on-write with every worker). The list of function-level imports was taken from an AST
scan of the allowlisted modules (`tests/vm/guest/test_guest_stdlib_lazy_imports.py` repeats
the scan, so a Python upgrade that adds one fails a test instead of a plugin).
"""

from __future__ import annotations

import codecs
import encodings
import importlib
import pkgutil
from typing import Final

# Function-level imports of the allowlisted modules that a plugin can reach. Not listed, on
# purpose: `uuid`'s node lookups (`uuid1`/`getnode` are not in its facade), `hashlib`'s
# fallbacks to the pure modules (OpenSSL is there), `decimal`'s `_pydecimal` (the C one is).
LAZY_IMPORTS: Final = ("heapq", "unicodedata", "_strptime", "time")

# Imported from C through the calling plugin frame's `__import__` (see the module docstring).
C_IMPLICIT_IMPORTS: Final = frozenset({"_strptime", "time"})

# `encodings` modules that are not text encodings (bytes-to-bytes or str-to-str transforms
# that `str.encode`/`bytes.decode` refuse), or not available on this platform.
_NOT_TEXT_CODECS: Final = frozenset(
    {
        "base64_codec",
        "bz2_codec",
        "hex_codec",
        "quopri_codec",
        "rot_13",
        "uu_codec",
        "zlib_codec",
        "mbcs",
        "oem",
        "cp65001",
    }
)


def text_codec_modules() -> list[str]:
    """Every `encodings` module that implements a text encoding on this platform."""
    return sorted(
        info.name
        for info in pkgutil.iter_modules(encodings.__path__)
        if info.name not in _NOT_TEXT_CODECS
        and not info.name.startswith("_")
        and info.name != "aliases"
    )


def preload_lazy_imports() -> None:
    """Fork-server-only, before any fork: import every module listed above."""
    for name in LAZY_IMPORTS:
        importlib.import_module(name)
    for name in text_codec_modules():
        try:
            module = importlib.import_module(f"encodings.{name}")
        except ImportError:  # a codec whose C part this build lacks
            continue
        if hasattr(module, "getregentry"):
            codecs.lookup(name)
