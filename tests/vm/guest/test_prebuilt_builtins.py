"""The builtins the fork server builds once go to one runtime only: a second runtime in the
same process (never the case in a worker, but possible) builds its own, so no `print`,
`__import__` or guest-made change of one runtime's builtins reaches another's.

`prepare_worker_interpreter` is irreversible and process-wide, so these run in a fork.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path

from _forking import fork
from suaveplan_sandbox.vm._guest import (
    GuestRuntime,
    _runtime,
    compile_bundle,
    load_plugin,
    prepare_worker_interpreter,
)

PLUGIN = """
def hello(who):
    print("hello", who)
    return len(who)
"""


def _in_prepared_child(body: Callable[[], dict[str, object]]) -> dict[str, object]:
    r, w = os.pipe()
    pid = fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            os.close(r)
            prepare_worker_interpreter()
            os.write(w, pickle.dumps(body()))
        except BaseException:
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    out = pickle.loads(data)
    assert isinstance(out, dict)
    return out


def test_only_the_first_runtime_takes_the_prebuilt_builtins_and_each_prints_to_its_own_log(
    tmp_path: Path,
) -> None:
    (tmp_path / "plugin.py").write_text(PLUGIN)
    compiled = compile_bundle(load_plugin(tmp_path / "plugin.py"))

    def body() -> dict[str, object]:
        assert len(_runtime._PREBUILT_BUILTINS) == 1
        prebuilt = _runtime._PREBUILT_BUILTINS[0]
        logs: dict[str, list[str]] = {"a": [], "b": []}
        a = GuestRuntime(compiled, host_call=lambda *_: None, log=lambda _, t: logs["a"].append(t))
        b = GuestRuntime(compiled, host_call=lambda *_: None, log=lambda _, t: logs["b"].append(t))
        a.start()
        b.start()
        results = [a.call("hello", ["ann"], {}), b.call("hello", ["bob"], {})]
        # A change made to one runtime's builtins (by trusted code here; the guest cannot
        # name `__builtins__`) is not seen by the other.
        a._builtins["len"] = lambda _: -1
        results.append(b.call("hello", ["bob"], {}))
        return {
            "first_took_it": a._builtins is prebuilt,
            "distinct": a._builtins is not b._builtins,
            "left": len(_runtime._PREBUILT_BUILTINS),
            "suaveplan_distinct": a._builtins["__sp_suaveplan__"]
            is not b._builtins["__sp_suaveplan__"],
            "import_bound": (
                getattr(a._builtins["__import__"], "__self__", None) is a,
                getattr(b._builtins["__import__"], "__self__", None) is b,
            ),
            "logs": logs,
            "results": results,
        }

    out = _in_prepared_child(body)
    assert out["first_took_it"] is True
    assert out["distinct"] is True
    assert out["left"] == 0
    assert out["suaveplan_distinct"] is True
    assert out["import_bound"] == (True, True)
    assert out["logs"] == {"a": ["hello ann"], "b": ["hello bob", "hello bob"]}
    assert out["results"] == [3, 3, 3]


def test_the_prebuilt_builtins_match_the_ones_a_runtime_builds_itself(tmp_path: Path) -> None:
    (tmp_path / "plugin.py").write_text(PLUGIN)
    compiled = compile_bundle(load_plugin(tmp_path / "plugin.py"))

    def body() -> dict[str, object]:
        first = GuestRuntime(compiled, host_call=lambda *_: None, log=lambda *_: None)
        second = GuestRuntime(compiled, host_call=lambda *_: None, log=lambda *_: None)
        first.start()
        second.start()
        per_runtime = {"print", "__import__", "__sp_suaveplan__"}

        def shared(rt: GuestRuntime) -> dict[str, object]:
            return {k: v for k, v in rt._builtins.items() if k not in per_runtime}

        return {
            "same_names": sorted(first._builtins) == sorted(second._builtins),
            "same_shared": shared(first) == shared(second),
            "names": sorted(first._builtins),
        }

    out = _in_prepared_child(body)
    assert out["same_names"] is True
    assert out["same_shared"] is True
    names = out["names"]
    assert isinstance(names, list)
    for absent in ("open", "__loader__", "globals", "vars", "breakpoint", "input"):
        assert absent not in names
    for present in ("print", "__import__", "ValueError", "getattr", "type", "len"):
        assert present in names
