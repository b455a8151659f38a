"""Benchmarks, run from the repository root: ``.venv/bin/python -m tools.bench.<name>``.

See docs/performance.md for what each one measures and the recorded figures.
"""
