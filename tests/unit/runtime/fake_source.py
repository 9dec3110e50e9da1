"""A scripted `listwatch.ListerWatcher` for unit tests (no network).

Each LIST pops the next scripted answer (an `ObjList` or an exception); each WATCH pops the
next scripted stream: an exception raised when opening, or a list of steps played in order
(an event dict is yielded, an exception is raised mid-stream, `HANG` blocks until the test
cancels). An exhausted watch script hangs, so a reflector idles once the script is played.
Every call is recorded with its parameters.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from localcache.runtime import kube

Obj = dict[str, Any]
HANG = object()
Step = Obj | BaseException | object


def cm(name: str, rv: str, *, namespace: str = "ns", **meta: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv, **meta},
    }


def event(kind: str, obj: Obj) -> Obj:
    return {"type": kind, "object": obj}


def bookmark(rv: str) -> Obj:
    return event("BOOKMARK", {"kind": "ConfigMap", "metadata": {"resourceVersion": rv}})


def page(rv: str, *items: Obj, token: str = "") -> kube.ObjList:
    return kube.ObjList(items=list(items), resource_version=rv, continue_token=token)


@dataclass
class ListCall:
    resource_version: str
    limit: int | None
    continue_token: str


@dataclass
class WatchCall:
    resource_version: str
    timeout_seconds: int
    read_deadline: float


class _Stream:
    def __init__(self, steps: list[Step] | BaseException) -> None:
        self._steps = steps

    async def __aenter__(self) -> AsyncIterator[Obj]:
        if isinstance(self._steps, BaseException):
            raise self._steps
        return self._iterate(deque(self._steps))

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    async def _iterate(self, steps: deque[Step]) -> AsyncIterator[Obj]:
        while steps:
            step = steps.popleft()
            if step is HANG:
                await asyncio.Event().wait()
            elif isinstance(step, BaseException):
                raise step
            elif isinstance(step, dict):
                yield step
            await asyncio.sleep(0)


@dataclass
class FakeSource:
    lists: list[kube.ObjList | BaseException] = field(default_factory=list)
    watches: list[list[Step] | BaseException] = field(default_factory=list)
    list_calls: list[ListCall] = field(default_factory=list)
    watch_calls: list[WatchCall] = field(default_factory=list)

    @property
    def description(self) -> str:
        return "configmaps in ns"

    async def list(
        self, *, resource_version: str, limit: int | None, continue_token: str
    ) -> kube.ObjList:
        self.list_calls.append(ListCall(resource_version, limit, continue_token))
        await asyncio.sleep(0)
        if not self.lists:
            await asyncio.Event().wait()
        answer = self.lists.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def watch(
        self, *, resource_version: str, timeout_seconds: int, read_deadline: float
    ) -> _Stream:
        self.watch_calls.append(WatchCall(resource_version, timeout_seconds, read_deadline))
        return _Stream(self.watches.pop(0) if self.watches else [HANG])


async def settle(rounds: int = 50) -> None:
    """Let every runnable task run until it blocks."""
    for _ in range(rounds):
        await asyncio.sleep(0)
