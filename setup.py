"""Only the optional C accelerator lives here; everything else is in pyproject.toml.

`suaveplan_sandbox._speedups` is optional at build time: without a C compiler the install
still succeeds and the pure-Python checks (the reference implementation) are used.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "suaveplan_sandbox._speedups",
            sources=["src/suaveplan_sandbox/_speedups.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
