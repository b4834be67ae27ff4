"""Run the example WASM plugin under its manifest: `python examples/wasm/run.py`."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

from suaveplan_sandbox.permissions import PermissionPolicy
from suaveplan_sandbox.wasm import RunResult, create_wasm_sandbox

HERE = Path(__file__).resolve().parent


async def run_wasm_example(path: Path = HERE) -> tuple[RunResult, str]:
    """Run the plugin in `path` on a scratch copy of its folder; returns (result, output file).

    The plugin's root is its manifest's folder (as `suaveplan-sandbox run` assumes): the
    guest sees `input/` read-only and `output/` writable, and nothing else.
    """
    manifest = tomllib.loads((path / "manifest.toml").read_text())
    with tempfile.TemporaryDirectory(prefix="suaveplan-wasm-example-") as tmp:
        root = Path(tmp) / "root"
        shutil.copytree(path, root)
        policy = PermissionPolicy.from_manifest(manifest, root=root)
        async with await create_wasm_sandbox(
            wasm_module_path=path / manifest["entry"], policy=policy
        ) as sb:
            result = await sb.run(argv=[manifest["name"]])
        written = (root / "output" / "result.txt").read_text()
    return result, written


def main() -> int:
    result, written = asyncio.run(run_wasm_example())
    sys.stdout.write(result.stdout.decode())
    sys.stdout.write(f"output/result.txt: {written}")
    return result.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
