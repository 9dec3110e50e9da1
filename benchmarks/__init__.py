"""Benchmarks, each printed beside a baseline measured in the same run (`python -m benchmarks`).

Every module named `<name>_bench.py` in this package is a benchmark: it defines `main()`
(plain or `async`, optionally taking the remaining command-line arguments) and prints its own
table. `python -m benchmarks` runs them all; `python -m benchmarks informer admission` runs
those named. Adding a benchmark means adding a module, nothing else.
"""
