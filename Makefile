# Two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEVSTAMP := $(VENV)/.installed-dev

.PHONY: run test lint typecheck pytest bench asan wasm-fixtures fuzz soak security-report docs clean

# setup.py builds the optional C accelerator: a change to it or its source reinstalls.
$(STAMP): pyproject.toml setup.py src/suaveplan_sandbox/_speedups.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(STAMP)

$(DEVSTAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[dev]'
	touch $(DEVSTAMP)

run: $(DEVSTAMP)
	$(PY) -m suaveplan_sandbox.cli demo examples

test: $(DEVSTAMP)
	$(PY) -m ruff check src tests benchmarks examples fuzz scripts
	$(PY) -m mypy
	# pytest exits 5 when it collects nothing: that is a failure here, never a pass.
	$(PY) -m pytest; status=$$?; if [ $$status -eq 5 ]; then echo "no tests collected" >&2; exit 1; fi; exit $$status

lint: $(DEVSTAMP)
	$(PY) -m ruff check src tests benchmarks examples fuzz scripts
	$(PY) -m ruff format --check src tests benchmarks examples fuzz scripts

typecheck: $(DEVSTAMP)
	$(PY) -m mypy

bench: $(DEVSTAMP)
	$(PY) -m benchmarks

# The C accelerator rebuilt with AddressSanitizer and UBSan, run against its tests.
asan: $(DEVSTAMP)
	$(PY) scripts/asan_speedups.py

# Longer fuzzing than the bounded run inside `make test`: FUZZ_SECONDS per target.
FUZZ_SECONDS ?= 300
fuzz: $(DEVSTAMP)
	$(PY) -m fuzz --seconds $(FUZZ_SECONDS)

# At least 60 s of mixed calls over 16 VM and WASM sandboxes; resource growth must stay flat.
SOAK_SECONDS ?= 60
soak: $(DEVSTAMP)
	$(PY) -m benchmarks.soak --seconds $(SOAK_SECONDS) --sandboxes 16

# One table: escape techniques, fuzz executions, faults, soak figures.
security-report: $(DEVSTAMP)
	$(PY) scripts/security_report.py

docs: $(DEVSTAMP)
	$(PY) -m mkdocs build --strict --site-dir build/site

wasm-fixtures: $(DEVSTAMP)
	$(PY) tests/wasm/fixtures/build.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build
