"""Coverage-guided fuzz targets (atheris): frame decoder, URL check, fs check (C against
Python), SQL gate and the fs adapter's inline read (C against Python).

`python -m fuzz [--seconds N] [--targets frame_decoder,url_check,fs_check,sql_gate,...] [--json]`
runs each target in its own interpreter (see `fuzz._runner`); `make fuzz` runs it for longer,
and `tests/fuzz/test_fuzz_bounded.py` runs a few seconds of each in CI. Seed corpora come from
`tests/vectors/` (the inline read's from the tree it builds); crash inputs land in
`build/fuzz/<target>/`. A crash that is a real bug becomes a row in `tests/vectors/` marked
`"source": "found by fuzzing"`, next to its fix. Reproduce one with
`python -m fuzz.<target> build/fuzz/<target>/crash-…` (libFuzzer runs the given files once
and exits).
"""
