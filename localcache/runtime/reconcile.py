"""The reconcile contract: one method, one small result, errors classified by type.

A `Reconciler` is told only *which* object to look at (an `ObjectKey`), never what happened
to it: it re-reads the current state (from an informer store) and drives the world towards
it. The same key may be reconciled many times for one change, or once for many changes
(duplicate adds coalesce in the work queue), and possibly after the object is gone. So a
reconcile must be idempotent and level-based.

What the controller does with the outcome (`controller.py`, like controller-runtime's
`reconcileHandler`):

- returns `Result()` → success: the key's backoff is forgotten;
- returns `Result(requeue_after=s)` with `s > 0` → the backoff is forgotten and the key is
  reconciled again after `s` seconds (earlier if something else adds it). `0` or `None`
  mean success, as in controller-runtime;
- raises any exception → the key is retried with per-item exponential backoff
  (5 ms, 10 ms, … 1000 s) and the error is logged and counted;
- raises `errors.TerminalError` → logged and counted, *not* retried (a retry cannot fix it;
  a later change to the object will add the key again).

Promised: one key is never reconciled by two workers at the same time. Not promised: any
ordering between different keys, or that a reconcile sees the newest state (the store is
eventually consistent). A reconcile may be cancelled (timeout, shutdown) at any await point.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from localcache.runtime import keys


@dataclass(frozen=True, slots=True)
class Result:
    """What a successful reconcile asks for. `requeue_after`: seconds until the next look."""

    requeue_after: float | None = None

    def __post_init__(self) -> None:
        if self.requeue_after is not None and self.requeue_after < 0:
            raise ValueError(f"requeue_after must be >= 0, got {self.requeue_after}")


class Reconciler(Protocol):
    """Drives the object named by `key` towards its desired state (see the module doc)."""

    async def reconcile(self, key: keys.ObjectKey) -> Result: ...


class ReconcilerFunc:
    """Adapts an `async def f(key) -> Result` function to the `Reconciler` protocol."""

    def __init__(self, func: Callable[[keys.ObjectKey], Awaitable[Result]]) -> None:
        self._func = func

    async def reconcile(self, key: keys.ObjectKey) -> Result:
        return await self._func(key)
