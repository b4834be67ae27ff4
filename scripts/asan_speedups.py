"""`make asan`: run the C accelerator's tests with it built under AddressSanitizer and UBSan.

The editable install keeps `_speedups*.so` in `src/suaveplan_sandbox`; this swaps in a
sanitizer build for one pytest run (with `PYTHONMALLOC=malloc`, so heap errors in our code
are not hidden inside pymalloc's arenas) and always puts the normal build back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "suaveplan_sandbox"
TESTS = [
    "tests/permissions/test_speedups.py",
    "tests/permissions/test_fs_rules.py",
    "tests/permissions/test_fetch_rules.py",
    "tests/permissions/test_checker.py",
    "tests/permissions/test_rule_properties.py",
    "tests/adapters/test_fs_inline.py",
    "tests/vm/test_poll_recv.py",
]


def _runtime(name: str) -> str:
    gcc = shutil.which("gcc") or "gcc"
    out = subprocess.run(  # noqa: S603 - fixed arguments
        [gcc, f"-print-file-name={name}"], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def main() -> int:
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    built = PACKAGE / f"_speedups{suffix}"
    if not built.exists():
        print(f"{built} is missing: run `make test` (it builds the accelerator) first")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / built.name
        shutil.copy2(built, saved)
        try:
            subprocess.run(  # noqa: S603 - fixed arguments
                [
                    shutil.which("gcc") or "gcc",
                    "-O1",
                    "-g",
                    "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=undefined",
                    "-fno-omit-frame-pointer",
                    "-fPIC",
                    "-shared",
                    f"-I{sysconfig.get_paths()['include']}",
                    str(PACKAGE / "_speedups.c"),
                    "-o",
                    str(built),
                ],
                check=True,
            )
            env = dict(
                os.environ,
                PYTHONMALLOC="malloc",
                ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
                LD_PRELOAD=f"{_runtime('libasan.so')} {_runtime('libubsan.so')}",
            )
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS]
            run = subprocess.run(cmd, cwd=ROOT, env=env, check=False)  # noqa: S603
            return run.returncode
        finally:
            shutil.copy2(saved, built)


if __name__ == "__main__":
    raise SystemExit(main())
