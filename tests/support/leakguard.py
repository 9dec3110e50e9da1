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


GRACE_S = 5.0
"""How long finishing tasks may take to end. One second was once too short on a loaded CI
(6d8e672, a webhook-serving test; not reproduced in 25 runs, which left no task alive at its
teardown even with no grace); a leaked task never ends, so the longer grace still fails it."""


async def assert_no_leaked_tasks(
    before: Iterable[asyncio.Task[object]], *, grace: float = GRACE_S
) -> None:
    """Give finishing tasks `grace` seconds to end, then fail naming any that are still alive
    (name, coroutine, where it waits)."""
    before = set(before)
    leaked = leaked_tasks(before)
    if leaked:
        await asyncio.wait(leaked, timeout=grace)
        leaked = leaked_tasks(before)
    if leaked:
        names = "; ".join(sorted(_described(t) for t in leaked))
        for task in leaked:
            task.cancel()
        pytest.fail(f"test leaked {len(leaked)} asyncio task(s): {names}")


@pytest.fixture
async def task_leak_guard() -> AsyncIterator[None]:
    """Use in async tests: fails the test when it leaves tasks behind."""
    before = set(asyncio.all_tasks())
    yield
    await assert_no_leaked_tasks(before)


def _described(task: asyncio.Task[object]) -> str:
    """The task's name, coroutine and where it waits: enough to find who started it."""
    where = ", ".join(f"{f.f_code.co_filename}:{f.f_lineno}" for f in task.get_stack())
    return f"{task.get_name()} {task.get_coro()!r} at {where or '?'}"
