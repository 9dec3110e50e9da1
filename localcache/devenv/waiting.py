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
    attempts = _Attempts(timeout, what)
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
        except (AssertionError, LookupError) as exc:
            attempts.last_error = exc
        attempts.raise_if_late()
        await asyncio.sleep(interval)


def wait_until_sync(
    predicate: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05, what: str
) -> T:
    """Blocking variant of `wait_until` for synchronous tests and fixtures."""
    attempts = _Attempts(timeout, what)
    while True:
        try:
            value = predicate()
            if value:
                return value
        except (AssertionError, LookupError) as exc:
            attempts.last_error = exc
        attempts.raise_if_late()
        time.sleep(interval)


class _Attempts:
    """The deadline of one wait and the last error its predicate raised."""

    def __init__(self, timeout: float, what: str) -> None:
        self.timeout = timeout
        self.what = what
        self.deadline = time.monotonic() + timeout
        self.last_error: BaseException | None = None

    def raise_if_late(self) -> None:
        """Raise WaitTimeout naming `what` (and the last error) once the deadline passed."""
        if time.monotonic() >= self.deadline:
            detail = f" (last error: {self.last_error!r})" if self.last_error else ""
            raise WaitTimeout(f"within {self.timeout:.1f}s: {self.what}{detail}")
