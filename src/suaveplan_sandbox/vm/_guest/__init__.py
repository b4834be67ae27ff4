"""In-interpreter guest layer: load/check plugins (host), compile and run them (worker)."""

from suaveplan_sandbox.vm._guest._loader import PluginBundle, PluginModule, load_plugin
from suaveplan_sandbox.vm._guest._runtime import (
    CompiledBundle,
    GuestRuntime,
    compile_bundle,
    prepare_worker_interpreter,
    validate_result,
)

__all__ = [
    "CompiledBundle",
    "GuestRuntime",
    "PluginBundle",
    "PluginModule",
    "compile_bundle",
    "load_plugin",
    "prepare_worker_interpreter",
    "validate_result",
]
