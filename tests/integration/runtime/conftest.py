"""Fixtures for the runtime's integration tests: an API client on the real control plane,
background tasks that are always cancelled, a recording reconciler, and etcd's JSON gateway."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localcache.devenv.controlplane import ControlPlane
from localcache.runtime import clock, controller, informer, keys, kube, listwatch, reconcile, store
from localcache.runtime import workqueue as wq

Obj = dict[str, Any]
Spawn = Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]]


@pytest.fixture
async def kube_client(control_plane: ControlPlane) -> AsyncIterator[kube.Kube]:
    client = await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path)
    async with client:
        yield client


@pytest.fixture
async def spawn() -> AsyncIterator[Spawn]:
    """Start named background tasks; every one still running is cancelled at the end."""
    tasks: list[asyncio.Task[Any]] = []

    def start(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        tasks.append(task)
        return task

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def kubeconfig_for_server(plane: ControlPlane, path: Path, server: str) -> Path:
    """The admin kubeconfig, pointed at another address (e.g. a proxy in front of the
    apiserver, or a port where nothing listens)."""
    config = plane.kubeconfig(plane.admin)
    config["clusters"][0]["cluster"]["server"] = server
    path.write_text(json.dumps(config))
    return path


def configmap(namespace: str, name: str, **data: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": dict(data),
    }


def configmap_informer(client: kube.Kube, namespace: str, **options: Any) -> informer.Informer:
    source = listwatch.ListWatch(client, kube.CONFIG_MAPS, namespace=namespace)
    return informer.Informer(source, **options)


@dataclass
class RecordingReconciler:
    """Records each reconcile's key and the data it read from the store; tracks overlap."""

    reader: store.Reader
    seen: list[tuple[keys.ObjectKey, Obj | None]] = field(default_factory=list)
    in_flight: set[keys.ObjectKey] = field(default_factory=set)
    overlaps: list[keys.ObjectKey] = field(default_factory=list)
    hold: float = 0.0
    fail_once: set[str] = field(default_factory=set)

    async def reconcile(self, key: keys.ObjectKey) -> reconcile.Result:
        if key in self.in_flight:
            self.overlaps.append(key)
        self.in_flight.add(key)
        try:
            obj = self.reader.get(key)
            self.seen.append((key, None if obj is None else dict(obj.get("data") or {})))
            if self.hold:
                await asyncio.sleep(self.hold)
            if key.name in self.fail_once:
                self.fail_once.discard(key.name)
                raise RuntimeError(f"scripted failure for {key}")
            return reconcile.Result()
        finally:
            self.in_flight.discard(key)

    def last_seen(self, name: str) -> Obj | bool | None:
        """The data the last reconcile of `name` read (None: absent), False if never run."""
        for key, data in reversed(self.seen):
            if key.name == name:
                return data
        return False


def make_controller(
    name: str, rec: reconcile.Reconciler, *, workers: int = 1, **options: Any
) -> controller.Controller:
    sys_clock = clock.SystemClock()
    queue = wq.WorkQueue(name, clock=sys_clock, metrics=options.pop("queue_metrics", None))
    return controller.Controller(name, rec, queue, clock=sys_clock, workers=workers, **options)


# ------------------------------------------------------------------------- etcd gateway


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def etcd_call(plane: ControlPlane, path: str, body: Obj) -> Obj:
    """POST to etcd's v3 JSON gateway (the apiserver is not involved)."""
    request = urllib.request.Request(
        f"{plane.etcd_url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        answer: Obj = json.loads(resp.read())
    return answer


def etcd_revision(plane: ControlPlane) -> int:
    answer = etcd_call(plane, "/v3/kv/range", {"key": _b64("/registry/namespaces/default")})
    return int(answer["header"]["revision"])


def etcd_compact(plane: ControlPlane, revision: int) -> None:
    etcd_call(plane, "/v3/kv/compaction", {"revision": str(revision), "physical": True})


def etcd_delete(plane: ControlPlane, key: str) -> int:
    """Delete one key in etcd directly; returns how many keys went."""
    answer = etcd_call(plane, "/v3/kv/deleterange", {"key": _b64(key)})
    return int(answer.get("deleted") or 0)
