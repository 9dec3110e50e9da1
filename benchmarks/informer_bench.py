"""Informer throughput and cache memory on the real control plane, beside bare watch loops.

One run, one control plane (started here), 10,000 small ConfigMaps created in a namespace
(`LOCALCACHE_BENCH_OBJECTS` overrides the count). Then the *same* stream, a WATCH from the
resourceVersion just before the first create (replayed by the apiserver's watch cache), is
consumed four ways, each `ROUNDS` times in alternation, best run kept:

- bare raw loop: kubernetes_asyncio's REST client, each line only `json.loads`-ed;
- bare typed loop: kubernetes_asyncio's `Watch().stream(...)`, decoding into V1ConfigMap;
- informer -> queue: `Informer` (its first LIST is the exact state at that resourceVersion,
  i.e. empty, then the watch) → store → `enqueue_self` → `WorkQueue`, no workers: the
  informer's own cost;
- informer path: the same plus a `Controller` with a no-op reconciler, until every key has
  been reconciled.

Reported: events per second (wall clock) and client CPU microseconds per event. Then an
informer fills its cache once by a normal LIST and once from the watch replay, and the
memory retained per cached object is measured with tracemalloc (Python allocations still
alive after a full GC) and as the growth of the resident set, against each object's JSON
size as cached (managedFields stripped) and as received. The baselines import
kubernetes_asyncio directly: that is what they measure.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio import watch as k8s_watch

from localcache.runtime import (
    clock,
    controller,
    handlers,
    informer,
    keys,
    kube,
    reconcile,
    reflector,
    workqueue,
)
from localcache.runtime import logging as logging_mod
from localcache.runtime.testing.controlplane import ControlPlane

NAMESPACE = "bench"
CREATE_CONCURRENCY = 48
TARGET_RATE_RATIO = 0.70
ROUNDS = 3
TARGET_MEMORY_RATIO = 3.0


def object_count() -> int:
    return int(os.environ.get("LOCALCACHE_BENCH_OBJECTS", "10000"))


def small_configmap(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"cm-{i:05d}",
            "namespace": NAMESPACE,
            "labels": {"app": "bench", "shard": str(i % 10)},
        },
        "data": {"index": str(i), "value": "v" * 32},
    }


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass
class Run:
    label: str
    events: int
    wall_s: float
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.events / self.wall_s

    @property
    def cpu_us_per_event(self) -> float:
        return 1e6 * self.cpu_s / self.events


async def timed(label: str, events: int, body: Callable[[], Awaitable[None]]) -> Run:
    gc.collect()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    await body()
    return Run(label, events, time.perf_counter() - wall0, time.process_time() - cpu0)


# ------------------------------------------------------------------------- set-up


async def create_objects(client: kube.Kube, n: int) -> float:
    await client.create(kube.NAMESPACES, {"metadata": {"name": NAMESPACE}})
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def create(i: int) -> None:
        async with gate:
            await client.create(kube.CONFIG_MAPS, small_configmap(i))

    started = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for i in range(n):
            tg.create_task(create(i), name=f"create-{i}")
    return time.perf_counter() - started


# ------------------------------------------------------------------------- baselines


async def raw_api(plane: ControlPlane) -> k8s.ApiClient:
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(
        config_file=str(plane.kubeconfig_path), client_configuration=configuration
    )
    return k8s.ApiClient(configuration)


async def bare_raw_loop(plane: ControlPlane, rv: str, n: int) -> None:
    async with await raw_api(plane) as api:
        core = k8s.CoreV1Api(api)
        resp: Any = await core.list_namespaced_config_map(
            NAMESPACE, watch=True, resource_version=rv, timeout_seconds=600, _preload_content=False
        )
        try:
            seen = 0
            while seen < n:
                line = await resp.content.readline()
                if not line:
                    raise RuntimeError(f"stream ended after {seen} events")
                if json.loads(line)["type"] == "ADDED":
                    seen += 1
        finally:
            resp.close()


async def bare_typed_loop(plane: ControlPlane, rv: str, n: int) -> None:
    async with await raw_api(plane) as api:
        core = k8s.CoreV1Api(api)
        seen = 0
        async with k8s_watch.Watch() as watch:
            stream = watch.stream(
                core.list_namespaced_config_map, NAMESPACE, resource_version=rv, timeout_seconds=600
            )
            async for event in stream:
                if event["type"] == "ADDED":
                    seen += 1
                    if seen == n:
                        break


# ------------------------------------------------------------------------- informer path


class ReplayFrom:
    """A ListerWatcher whose first LIST is the exact state at `rv`, so that the watch after it
    replays every change since: the same stream the bare loops read."""

    def __init__(self, inner: reflector.ListWatch, client: kube.Kube, rv: str) -> None:
        self._inner = inner
        self._client = client
        self._rv = rv
        self._first = True

    @property
    def description(self) -> str:
        return self._inner.description

    async def list(
        self, *, resource_version: str, limit: int | None, continue_token: str
    ) -> kube.ObjList:
        if self._first:
            self._first = False
            return await self._client.list(
                kube.CONFIG_MAPS,
                namespace=NAMESPACE,
                resource_version=self._rv,
                resource_version_match="Exact",
            )
        return await self._inner.list(
            resource_version=resource_version, limit=limit, continue_token=continue_token
        )

    def watch(
        self, *, resource_version: str, timeout_seconds: int, read_deadline: float
    ) -> kube.WatchStream:
        return self._inner.watch(
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            read_deadline=read_deadline,
        )


async def informer_path(client: kube.Kube, rv: str, n: int, *, reconcile_keys: bool = True) -> None:
    """Replay the stream through an informer into a work queue; with `reconcile_keys` a
    controller with a no-op reconciler drains it, else the run ends when n keys were queued."""
    sys_clock = clock.SystemClock()
    source = ReplayFrom(
        reflector.ListWatch(client, kube.CONFIG_MAPS, namespace=NAMESPACE), client, rv
    )
    inf = informer.Informer(source, clock=sys_clock)
    done: set[keys.ObjectKey] = set()
    all_done = asyncio.Event()

    async def noop(key: keys.ObjectKey) -> reconcile.Result:
        done.add(key)
        if len(done) >= n:
            all_done.set()
        return reconcile.Result()

    queue = workqueue.WorkQueue("bench", clock=sys_clock)
    ctl = controller.Controller("bench", reconcile.ReconcilerFunc(noop), queue, clock=sys_clock)
    inf.add_handler(handlers.enqueue_self(queue))
    if not reconcile_keys:
        inf.add_handler(lambda ev: all_done.set() if len(queue) >= n else None)
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(inf.run(), name="bench-informer")]
        if reconcile_keys:
            tasks.append(tg.create_task(ctl.run(), name="bench-controller"))
        await all_done.wait()
        for task in tasks:
            task.cancel()


# ------------------------------------------------------------------------- memory


@dataclass
class Memory:
    how: str
    objects: int
    traced_per_object: float
    rss_per_object: float
    json_cached: float


async def measure_memory(source: reflector.ListerWatcher, how: str) -> Memory:
    """Sync an informer from `source` and measure what its cache retains per object."""
    gc.collect()
    rss0 = rss_bytes()
    tracemalloc.start()
    inf = informer.Informer(source)
    n = object_count()
    full = asyncio.Event()  # a replay fills the store from the watch, after the sync
    inf.add_handler(lambda ev: full.set() if len(inf.store) >= n else None)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(inf.run(), name="bench-memory-informer")
        await full.wait()
        gc.collect()
        traced, _ = tracemalloc.get_traced_memory()
        rss1 = rss_bytes()
        task.cancel()
    tracemalloc.stop()
    cached = inf.store.list()
    json_cached = sum(len(json.dumps(o, separators=(",", ":"))) for o in cached) / len(cached)
    return Memory(how, len(cached), traced / len(cached), (rss1 - rss0) / len(cached), json_cached)


async def received_json_size(client: kube.Kube) -> float:
    """Mean JSON size of an object as the apiserver sends it (managedFields included)."""
    page = await client.list(kube.CONFIG_MAPS, namespace=NAMESPACE, limit=500)
    return sum(len(json.dumps(o, separators=(",", ":"))) for o in page.items) / len(page.items)


# ------------------------------------------------------------------------- report


def report(
    n: int, create_s: float, runs: dict[str, Run], memory: list[Memory], received: float
) -> None:
    raw = runs["bare raw"]
    print(f"objects: {n}  (created in {create_s:.1f}s, {n / create_s:.0f}/s)")
    header = f"{'consumer of the same watch stream':<46}{'events/s':>10}{'CPU us/event':>14}"
    print(f"{header}{'vs raw':>8}")
    rows = (
        ("bare kubernetes_asyncio loop, json.loads only", "bare raw"),
        ("bare kubernetes_asyncio Watch (V1ConfigMap)", "bare typed"),
        ("informer -> queue (keys queued, no workers)", "informer queue"),
        ("informer -> queue -> no-op reconciler", "informer path"),
    )
    for label, key in rows:
        run = runs[key]
        print(
            f"{label:<46}{run.rate:>10.0f}{run.cpu_us_per_event:>14.1f}{run.rate / raw.rate:>8.0%}"
        )
    path = runs["informer path"]
    verdict = "ok" if path.rate >= TARGET_RATE_RATIO * raw.rate else "MISSED"
    print(
        f"informer path: {path.rate / raw.rate:.0%} of the bare loop's rate "
        f"(target >= {TARGET_RATE_RATIO:.0%}): {verdict}; by client CPU per event "
        f"{raw.cpu_us_per_event / path.cpu_us_per_event:.0%} (wall rates swing with machine load)"
    )
    print(
        f"{'cache filled by':<18}{'retained B/obj':>16}{'RSS growth B/obj':>18}"
        f"{'JSON cached':>13}{'x cached':>10}{'x received':>12}"
    )
    for m in memory:
        print(
            f"{m.how:<18}{m.traced_per_object:>16.0f}{m.rss_per_object:>18.0f}{m.json_cached:>13.0f}"
            f"{m.traced_per_object / m.json_cached:>10.2f}{m.traced_per_object / received:>12.2f}"
        )
    worst = max(m.traced_per_object for m in memory) / received
    verdict = "ok" if worst <= TARGET_MEMORY_RATIO else "MISSED"
    print(
        f"JSON as received (managedFields included): {received:.0f} B; retained memory "
        f"<= {worst:.2f}x of it (target <= {TARGET_MEMORY_RATIO:.0f}x): {verdict}"
    )


async def main() -> int:
    logging_mod.configure(level="warning", renderer="console")
    n = object_count()
    plane = ControlPlane(with_kcm=False)
    await asyncio.to_thread(plane.start)
    try:
        client = await kube.Kube.from_kubeconfig(plane.kubeconfig_path)
        async with client:
            rv = (await client.list(kube.CONFIG_MAPS, namespace=NAMESPACE)).resource_version
            create_s = await create_objects(client, n)
            bodies: dict[str, Callable[[], Awaitable[None]]] = {
                "bare raw": lambda: bare_raw_loop(plane, rv, n),
                "bare typed": lambda: bare_typed_loop(plane, rv, n),
                "informer queue": lambda: informer_path(client, rv, n, reconcile_keys=False),
                "informer path": lambda: informer_path(client, rv, n),
            }
            runs: dict[str, Run] = {}
            for _ in range(ROUNDS):
                for label, body in bodies.items():
                    run = await timed(label, n, body)
                    if label not in runs or run.rate > runs[label].rate:
                        runs[label] = run
            listing = reflector.ListWatch(client, kube.CONFIG_MAPS, namespace=NAMESPACE)
            memory = [
                await measure_memory(listing, "LIST"),
                await measure_memory(ReplayFrom(listing, client, rv), "watch events"),
            ]
            received = await received_json_size(client)
        report(n, create_s, runs, memory, received)
        return 0
    finally:
        await asyncio.to_thread(plane.stop)
