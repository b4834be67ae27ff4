"""suaveplan-sandbox: run untrusted plugins with exactly the capabilities their manifest declares.

The public API lives in subpackages: `permissions` (manifest, policy, checker, budgets),
`errors`, `metrics`, `gateway`, `adapters`, `vm` (Python guests), `wasm` (WASI guests) and
`testing` (fakes, `FakeClock`, conformance harnesses).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
