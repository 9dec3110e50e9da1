"""`python -m benchmarks [name ...]`: run the named benchmarks (all `*_bench.py` by default)."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
import sys
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path

SUFFIX = "_bench"


def available() -> list[str]:
    """Benchmark names: the `<name>_bench` modules of this package, sorted."""
    here = str(Path(__file__).resolve().parent)
    return sorted(
        info.name.removesuffix(SUFFIX)
        for info in pkgutil.iter_modules([here])
        if info.name.endswith(SUFFIX)
    )


def run(name: str, args: Sequence[str]) -> int:
    module = importlib.import_module(f"benchmarks.{name}{SUFFIX}")
    entry = module.main
    call_args = (list(args),) if inspect.signature(entry).parameters else ()
    result = entry(*call_args)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return int(result or 0)


async def _await(awaitable: Awaitable[object]) -> object:
    return await awaitable


def main(argv: Sequence[str]) -> int:
    names = available()
    wanted = [a for a in argv if not a.startswith("-")] or names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(names)}")
        return 2
    failures = 0
    for name in wanted:
        print(f"=== benchmark {name}", flush=True)
        started = time.monotonic()
        code = run(name, [a for a in argv if a.startswith("-")])
        print(f"=== benchmark {name} finished in {time.monotonic() - started:.1f}s (exit {code})")
        failures += code != 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
