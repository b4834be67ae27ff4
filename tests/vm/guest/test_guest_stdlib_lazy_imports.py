"""Allowlisted standard-library calls that import something late work in a hardened worker.

Landlock leaves a worker unable to read module files, so a module first imported after the
fork fails with PermissionError inside an allowed call (`Counter.most_common`,
`datetime.strptime`, `str.encode("cp1252")` all did). The fork server imports them first
(`_lazy_imports`); these tests run the calls in real workers and repeat the scan that found
the function-level imports, so a Python upgrade adding one fails here.
"""

from __future__ import annotations

import ast
import asyncio
import collections
import datetime
import importlib
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from suaveplan_sandbox.errors import SuaveplanError
from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.vm import create_vm_sandbox
from suaveplan_sandbox.vm._guest._lazy_imports import LAZY_IMPORTS, text_codec_modules
from suaveplan_sandbox.vm._guest._policy import ALLOWED_MODULES

PLUGIN = """
import collections
import datetime
import urllib.parse


def strptime(text, fmt):
    return datetime.datetime.strptime(text, fmt).isoformat()


def date_strptime(text, fmt):
    return datetime.datetime.strptime(text, fmt).date().isoformat()


def strftime(fmt):
    return datetime.datetime(2024, 2, 29, 13, 5).strftime(fmt)


def timetuple():
    return list(datetime.date(2024, 2, 29).timetuple())


def most_common(text, n):
    return collections.Counter(text).most_common(n)


def encode(text, codec):
    return text.encode(codec)


def decode(data, codec):
    return data.decode(codec)


def host(url):
    return urllib.parse.urlsplit(url).hostname
"""

CODECS = ["cp1252", "shift_jis", "gb18030", "big5", "koi8_r", "utf-16", "utf_32_be", "idna"]
SAMPLES = {
    "cp1252": "café €",
    "shift_jis": "日本語",
    "gb18030": "中文",
    "big5": "中文",
    "koi8_r": "привет",
    "utf-16": "text",
    "utf_32_be": "text",
    "idna": "bücher.example",
}


def _policy(tmp: Path) -> PermissionPolicy:
    return PermissionPolicy.from_manifest({"name": "lazy"}, root=tmp)


def test_late_imports_of_allowlisted_calls_work_in_a_hardened_worker(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text(PLUGIN)

    async def main() -> None:
        async with await create_vm_sandbox(
            plugin_module_path=tmp_path / "p.py",
            policy=_policy(tmp_path),
            require_hardening=("landlock_fs",),
        ) as sb:
            assert await sb.call("strptime", "2024-02-29 13:05", "%Y-%m-%d %H:%M") == (
                datetime.datetime(2024, 2, 29, 13, 5).isoformat()
            )
            assert await sb.call("date_strptime", "29/02/24", "%d/%m/%y") == "2024-02-29"
            fmt = "%Y %a %b %j %H:%M %%"
            assert await sb.call("strftime", fmt) == datetime.datetime(2024, 2, 29, 13, 5).strftime(
                fmt
            )
            assert await sb.call("timetuple") == list(datetime.date(2024, 2, 29).timetuple())
            text = "abracadabra"
            assert await sb.call("most_common", text, 2) == [
                list(pair) for pair in collections.Counter(text).most_common(2)
            ]
            for codec in CODECS:
                encoded = SAMPLES[codec].encode(codec)
                assert await sb.call("encode", SAMPLES[codec], codec) == encoded, codec
                assert await sb.call("decode", encoded, codec) == SAMPLES[codec], codec
            url = "https://bücher.example/x"
            assert await sb.call("host", url) == urllib.parse.urlsplit(url).hostname

    asyncio.run(main())


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("import time", "SAND_VM_MODULE_IMPORT_FORBIDDEN"),
        ("from heapq import nlargest", "SAND_VM_MODULE_IMPORT_FORBIDDEN"),
        # A private name is refused before its import is looked at.
        ("import _strptime as parse", "SAND_VM_ATTRIBUTE_FORBIDDEN"),
    ],
)
def test_plugin_source_still_cannot_import_them(tmp_path: Path, line: str, code: str) -> None:
    (tmp_path / "p.py").write_text(f"{line}\n\ndef f():\n    return 1\n")

    async def main() -> None:
        await create_vm_sandbox(plugin_module_path=tmp_path / "p.py", policy=_policy(tmp_path))

    with pytest.raises(SuaveplanError) as info:
        asyncio.run(main())
    assert info.value.code == code


def _function_level_imports(module_name: str) -> set[str]:
    module = importlib.import_module(module_name)
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return set()
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in top:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


# Function-level imports no plugin reaches: command-line mains (`getopt`, and `argparse`
# from 3.12), the node lookups behind `uuid1`/`getnode` (not in the facade), and pure-Python
# fallbacks for C modules this build has (`_pydatetime` from 3.12, in an import's `except`).
UNREACHABLE = {
    "argparse",
    "_pydatetime",
    "getopt",
    "logging",
    "platform",
    "shutil",
    "socket",
    "subprocess",
    "os",
    "sys",
    "_pydecimal",
    "_md5",
    "_sha1",
    "_sha2",
    "_sha256",
    "_sha3",
    "_sha512",
    "_blake2",
}


def test_every_function_level_import_of_an_allowlisted_module_is_accounted_for() -> None:
    modules = sorted(ALLOWED_MODULES - {"suaveplan"})
    # What importing the allowlisted modules loads anyway, in a fresh interpreter.
    script = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + ("print('\\n'.join(sorted(sys.modules)))")
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-I", "-c", script], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    late = set().union(*(_function_level_imports(m) for m in modules))
    unaccounted = late - loaded - set(LAZY_IMPORTS) - UNREACHABLE
    assert not unaccounted, f"add to LAZY_IMPORTS or explain in UNREACHABLE: {unaccounted}"


def test_every_text_codec_is_preloaded() -> None:
    names = text_codec_modules()
    assert {"cp1252", "shift_jis", "idna", "utf_16", "punycode"} <= set(names)
    assert not {"zlib_codec", "rot_13", "base64_codec", "aliases"} & set(names)
