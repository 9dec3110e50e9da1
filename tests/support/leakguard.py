"""A task-leak guard: fails a test that leaves asyncio tasks running behind it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import pytest


def leaked_tasks(before: Iterable[asyncio.Task[object]]) -> list[asyncio.Task[object]]:
    """Tasks alive now that were not alive in `before`, excluding the current one."""
    known = set(before)
    current = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t not in known and t is not current and not t.done()]


async def assert_no_leaked_tasks(
    before: Iterable[asyncio.Task[object]], *, grace: float = 1.0
) -> None:
    """Give finishing tasks `grace` seconds to end, then fail naming any that are still alive."""
    before = set(before)
    leaked = leaked_tasks(before)
    if leaked:
        await asyncio.wait(leaked, timeout=grace)
        leaked = leaked_tasks(before)
    if leaked:
        names = ", ".join(sorted(t.get_name() for t in leaked))
        for task in leaked:
            task.cancel()
        pytest.fail(f"test leaked {len(leaked)} asyncio task(s): {names}")


@pytest.fixture
async def task_leak_guard() -> AsyncIterator[None]:
    """Use in async tests: fails the test when it leaves tasks behind."""
    before = set(asyncio.all_tasks())
    yield
    await assert_no_leaked_tasks(before)
