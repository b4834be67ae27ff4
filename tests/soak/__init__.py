"""The bounded soak: the CI-sized run of `benchmarks/soak.py`, and proof its check can fail."""
