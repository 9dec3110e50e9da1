"""Waiting with a deadline, never sleeping as synchronisation.

`wait_until` polls a predicate (sync or async) until it returns a truthy value or the
deadline passes, then fails with `what` — the sentence that names what never happened.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """Raised when the awaited condition never became true."""


@overload
async def wait_until(
    predicate: Callable[[], Awaitable[T]],
    *,
    timeout: float = ...,
    interval: float = ...,
    what: str,
) -> T: ...


@overload
async def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float = ...,
    interval: float = ...,
    what: str,
) -> T: ...


async def wait_until(
    predicate: Callable[[], object],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str,
) -> object:
    """Return the first truthy value of `predicate()`; raise WaitTimeout naming `what`."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
        except (AssertionError, LookupError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise WaitTimeout(f"within {timeout:.1f}s: {what}{detail}")
        await asyncio.sleep(interval)


def wait_until_sync(
    predicate: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05, what: str
) -> T:
    """Blocking variant of `wait_until` for synchronous tests and fixtures."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except (AssertionError, LookupError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise WaitTimeout(f"within {timeout:.1f}s: {what}{detail}")
        time.sleep(interval)
