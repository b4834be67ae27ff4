"""The codes this library raises. Docs (`docs/reference/errors.md`) are generated from here."""

from __future__ import annotations

from typing import Final

from suaveplan_sandbox.errors._registry import define_codes

_OWNER: Final = "suaveplan_sandbox"

CODES: Final = define_codes(
    _OWNER,
    {
        "SAND_PERM_DENIED": "The manifest does not grant this capability request; "
        "details carry `capability` and `reason` only.",
        "BUDGET_EXCEEDED": "A CPU, memory or wall-clock budget was breached; "
        "`details.budget` names the dimension. The guest is ended.",
        "SAND_MANIFEST_INVALID": "The manifest is malformed: `details.errors` lists every "
        "problem with its `path`, `field` and, for rule lists, `index` (the first is repeated "
        "at the top level); a manifest file that cannot be used at all has `file` and "
        "`reason` instead, with an empty `errors` list.",
        "SAND_INVALID_ARGUMENT": "A host-side API was called with an argument it cannot accept.",
        "SAND_WIRE_ERROR": "A frame on the host/worker channel was malformed, oversized or "
        "out of protocol; the worker is ended.",
        "SAND_UNKNOWN_ERROR": "An error arrived from the wire with a code this process "
        "does not know; the original code is kept in `details.original_code`.",
        # VM host (Python guests)
        "SAND_VM_NAME_UNAVAILABLE": "Guest code referenced a name that is not available in "
        "the sandbox (os, sys, open, __import__, ...).",
        "SAND_VM_GLOBALS_FROZEN": "Guest code tried to modify the shared builtins or a "
        "module facade.",
        "SAND_VM_EVAL_REJECTED": "Guest code called eval/exec/compile directly.",
        "SAND_VM_INDIRECT_EVAL_REJECTED": "Guest code reached eval/exec/compile or code-object "
        "construction through another route (alias, getattr, passed as a value).",
        "SAND_VM_MODULE_IMPORT_FORBIDDEN": "The plugin imports a module outside its own package "
        "and the allowlist.",
        "SAND_VM_ATTRIBUTE_FORBIDDEN": "Guest code accesses a dunder, frame or code attribute.",
        "SAND_VM_SYNTAX_FORBIDDEN": "The plugin uses syntax the sandbox does not allow "
        "(metaclass=, except*, unreviewed constructs).",
        "SAND_VM_PLUGIN_ERROR": "The plugin raised an exception; `details.type` names its class.",
        "SAND_VM_RESULT_INVALID": "The plugin returned a value that cannot be encoded "
        "for the host.",
        "SAND_VM_NO_SUCH_FUNCTION": "The plugin has no public top-level function of that name.",
        "SAND_VM_WORKER_CRASHED": "The worker process died or broke protocol; the sandbox "
        "is ended.",
        "SAND_VM_HARDENING_UNAVAILABLE": "A required hardening layer (rlimits, no-new-privs, "
        "Landlock, seccomp), or the CPU/RSS sampling a cpuPercent or memoryMb budget needs "
        "(`details.layer` `budget-sampling`), is not available on this machine.",
        "SAND_VM_FORK_SERVER_FAILED": "The fork server could not be started or restarted.",
        "SAND_VM_DISPOSED": "The sandbox was used after dispose().",
        # WASM host
        "SAND_WASM_WASI_VERSION_UNSUPPORTED": "The module imports a WASI version other than "
        "wasi_snapshot_preview1.",
        "SAND_WASM_INSTANTIATION_FAILED": "The module could not be compiled or instantiated.",
        "SAND_WASM_PREOPEN_DENIED": "An fs rule cannot be expressed as a WASI preopen without "
        "granting more than it says, or a writable preopen would bypass the fs adapter's "
        "disk quota.",
        "SAND_WASM_OUTBOUND_DENIED": "The guest tried to connect to a host outside "
        "permissions.fetch.",
        "SAND_WASM_TRAP": "The guest trapped (unreachable, bad memory access, ...).",
        "SAND_WASM_NO_SUCH_EXPORT": "The module exports no function of that name.",
        "SAND_WASM_DISPOSED": "The sandbox was used after dispose().",
        "SAND_WASM_ENDED": "The sandbox was used after its guest was ended (a budget breach, "
        "or an unexpected wasmtime failure); `details` and the cause are that error's. "
        "Dispose it.",
        # Host adapters
        "SAND_FS_NOT_FOUND": "The file or directory does not exist.",
        "SAND_FS_NOT_A_FILE": "The path names a directory where a file was expected, or the "
        "reverse.",
        "SAND_FS_LINK_REFUSED": "The path crosses a symbolic link; links are never followed.",
        "SAND_FS_TOO_LARGE": "A read or write exceeded the adapter's size limit.",
        "SAND_FS_IO_ERROR": "The operating system refused the operation.",
        "SAND_FETCH_ADDRESS_REFUSED": "The host resolved to an address the adapter refuses "
        "(private, loopback, link-local, ...).",
        "SAND_FETCH_FAILED": "The HTTP request failed (connect, TLS, protocol).",
        "SAND_FETCH_TIMEOUT": "The HTTP request exceeded its time limit.",
        "SAND_FETCH_TOO_LARGE": "The HTTP response exceeded a size or header-count limit.",
        "SAND_FETCH_REDIRECT_REFUSED": "The response redirected and redirects are disabled, "
        "or the target was denied.",
        "SAND_DB_ERROR": "The database refused the statement.",
        "SAND_DB_MIGRATION_FAILED": "A plugin migration failed and was rolled back.",
        "SAND_SECRET_UNAVAILABLE": "The secret is declared but the backend has no value.",
        "SAND_EVENTS_ERROR": "The events backend failed.",
        "SAND_ADAPTER_MISSING": "No host adapter is configured for this capability.",
        "SAND_ADAPTER_FAILED": "A host adapter failed in an unexpected way.",
        "SAND_CANCELLED": "The call was cancelled because the sandbox was disposed.",
    },
)
