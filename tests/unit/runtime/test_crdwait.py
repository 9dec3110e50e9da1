"""crdwait.wait_served: returns once every CRD serves, waits while one is missing or not
Established, and does not wait for a CRD it may not read (403)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from localcache.runtime import errors
from localcache.runtime import kube as kube_mod
from localcache.runtime.crds import crdwait

Obj = dict[str, Any]
WANTED = [("a.example.io", "v1"), ("b.example.io", "v1")]


def served(name: str, *, established: bool = True) -> Obj:
    status = "True" if established else "False"
    return {
        "metadata": {"name": name},
        "spec": {"versions": [{"name": "v1", "served": True}]},
        "status": {"conditions": [{"type": "Established", "status": status}]},
    }


class FakeCrds:
    """What `get` answers per CRD name: an object, or an exception to raise."""

    def __init__(self, answers: dict[str, Obj | Exception]) -> None:
        self.answers = answers
        self.calls = 0
        self.called = asyncio.Event()

    async def reach(self, calls: int) -> None:
        """Return once `get` has been called `calls` times in all."""
        while self.calls < calls:
            self.called.clear()
            await asyncio.wait_for(self.called.wait(), 5)

    async def get(self, res: object, name: str, **_: object) -> Obj:
        self.calls += 1
        self.called.set()
        answer = self.answers.get(name) or errors.NotFound(404, f"{name} not found")
        if isinstance(answer, Exception):
            raise answer
        return answer


def wait(fake: FakeCrds) -> asyncio.Task[None]:
    api = cast(kube_mod.Kube, fake)
    return asyncio.create_task(crdwait.wait_served(api, WANTED, poll=0.001))


async def test_returns_once_every_crd_serves() -> None:
    fake = FakeCrds({"a.example.io": served("a.example.io")})
    task = wait(fake)
    await fake.reach(6)
    assert not task.done(), "returned while b.example.io was missing"
    fake.answers["b.example.io"] = served("b.example.io", established=False)
    calls = fake.calls
    await fake.reach(calls + 6)
    assert not task.done(), "returned while b.example.io was not Established"
    fake.answers["b.example.io"] = served("b.example.io")
    await asyncio.wait_for(task, 5)


async def test_a_crd_it_may_not_read_is_not_waited_for() -> None:
    forbidden = errors.ApiError(403, "forbidden", reason="Forbidden")
    fake = FakeCrds({"a.example.io": served("a.example.io"), "b.example.io": forbidden})
    await asyncio.wait_for(wait(fake), 5)


async def test_other_errors_are_retried() -> None:
    fake = FakeCrds({"a.example.io": errors.TransportError("connection refused")})
    task = wait(fake)
    await fake.reach(3)
    assert not task.done()
    fake.answers = {"a.example.io": served("a.example.io"), "b.example.io": served("b.example.io")}
    await asyncio.wait_for(task, 5)


@pytest.fixture(autouse=True)
def _no_poll_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crdwait, "POLL_MAX_S", 0.002)
