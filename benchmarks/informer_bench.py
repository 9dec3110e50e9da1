"""Informer throughput and cache memory on the real control plane, beside bare watch loops.

One run, one control plane (started here), 10,000 small ConfigMaps created in a namespace
(`LOCALCACHE_BENCH_OBJECTS` overrides the count). Then the *same* stream, a WATCH from the
resourceVersion just before the first create (replayed by the apiserver's watch cache), is
consumed five ways:

- bare raw loop (the baseline): kubernetes_asyncio's REST client, each line `json.loads`-ed;
- bare typed loop: kubernetes_asyncio's `Watch().stream(...)`, decoding into V1ConfigMap;
- informer -> queue: `Informer` (its first LIST is the exact state at that resourceVersion,
  i.e. empty, then the watch) → store → `enqueue_self` → `WorkQueue`, no workers;
- informer path: the same plus a `Controller` with a no-op reconciler, until every key has
  been reconciled, wired as the composition root wires it (queue and controller metrics on
  a `metrics.Metrics`, the default reconcile timeout);
- the informer path without metrics (as this benchmark measured it before), to show what
  they cost. The rate target is checked for both informer paths.

Fairness and stability on a small shared machine: a run is timed from the moment its WATCH
request goes out (for the informer, after its set-up LIST) until the last event is consumed
(for the informer path, reconciled), so both sides pay one request and the stream, and no
set-up or teardown. The raw API client is built once, outside the timings, as the informer's
client is. After an untimed warm-up, `LOCALCACHE_BENCH_ROUNDS` (default 15) rounds run every
variant once (the typed loop, slow and only context, in the first three), each right next to
a baseline run (baseline first in even rounds, second in odd ones). Reported per variant:
median events/s (wall clock) with the spread across rounds, median client CPU µs per event,
the cyclic GC's share of it, and the ratio to the baseline: the median over rounds of its rate
over the adjacent baseline run's, so swings of the machine's load, which last seconds, mostly
cancel out. What does not cancel is the load's level: the bare loop is partly bound by the
apiserver, the informer path by its own CPU, so the more other work takes the CPUs, the more
the rate ratio sinks towards the ratio of CPU per event (the load average is printed).

Then an informer fills its cache once by a normal LIST and once from the watch replay, and the
memory retained per cached object is measured with tracemalloc (Python allocations still
alive after a full GC) and as the growth of the resident set, against each object's JSON
size as cached (managedFields stripped) and as received. Targets (issue 4): the informer path
reaches at least 70 % of the bare loop's rate; a cached object costs at most 3x its JSON as
received. Each prints PASS or MISS. The baselines import kubernetes_asyncio directly: that
is what they measure.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import statistics
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio import watch as k8s_watch

from localcache.devenv.controlplane import ControlPlane
from localcache.runtime import (
    clock,
    controller,
    handlers,
    informer,
    keys,
    kube,
    listwatch,
    metrics,
    reconcile,
    workqueue,
)
from localcache.runtime import logging as logging_mod

NAMESPACE = "bench"
CREATE_CONCURRENCY = 48
TARGET_RATE_RATIO = 0.70
TARGET_MEMORY_RATIO = 3.0
TYPED_ROUNDS = 3


def object_count() -> int:
    return int(os.environ.get("LOCALCACHE_BENCH_OBJECTS", "10000"))


def rounds() -> int:
    return max(1, int(os.environ.get("LOCALCACHE_BENCH_ROUNDS", "15")))


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


class Stopwatch:
    """Wall and CPU time from `start()` to `stop()` (the first call of each counts), and the
    cyclic GC's pauses in between."""

    def __init__(self) -> None:
        self.wall0: float | None = None
        self.wall1: float | None = None
        self.cpu0 = self.cpu1 = self.gc_s = self._gc0 = 0.0

    def start(self) -> None:
        if self.wall0 is None:
            self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def stop(self) -> None:
        if self.wall1 is None:
            self.wall1, self.cpu1 = time.perf_counter(), time.process_time()

    def on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc0 = time.perf_counter()
        elif self.wall0 is not None and self.wall1 is None:
            self.gc_s += time.perf_counter() - self._gc0


@dataclass
class Run:
    events: int
    wall_s: float
    cpu_s: float
    gc_s: float

    @property
    def rate(self) -> float:
        return self.events / self.wall_s

    @property
    def cpu_us_per_event(self) -> float:
        return 1e6 * self.cpu_s / self.events

    @property
    def gc_share(self) -> float:
        return self.gc_s / self.cpu_s


Body = Callable[[Stopwatch], Awaitable[None]]


async def timed(events: int, body: Body) -> Run:
    gc.collect()
    watch = Stopwatch()
    gc.callbacks.append(watch.on_gc)
    try:
        await body(watch)
    finally:
        gc.callbacks.remove(watch.on_gc)
    if watch.wall0 is None or watch.wall1 is None:
        raise RuntimeError("the run did not start and stop its stopwatch")
    return Run(events, watch.wall1 - watch.wall0, watch.cpu1 - watch.cpu0, watch.gc_s)


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


async def bare_raw_loop(api: k8s.ApiClient, rv: str, n: int, watch: Stopwatch) -> None:
    core = k8s.CoreV1Api(api)
    watch.start()
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
        watch.stop()
    finally:
        resp.close()


async def bare_typed_loop(api: k8s.ApiClient, rv: str, n: int, watch: Stopwatch) -> None:
    core = k8s.CoreV1Api(api)
    seen = 0
    async with k8s_watch.Watch() as w:
        stream = w.stream(
            core.list_namespaced_config_map, NAMESPACE, resource_version=rv, timeout_seconds=600
        )
        watch.start()
        async for event in stream:
            if event["type"] == "ADDED":
                seen += 1
                if seen == n:
                    watch.stop()
                    break


# ------------------------------------------------------------------------- informer path


class ReplayFrom:
    """A ListerWatcher whose first LIST is the exact state at `rv`, so that the watch after it
    replays every change since: the same stream the bare loops read. `on_listed` is called
    when that LIST has been answered."""

    def __init__(
        self,
        inner: listwatch.ListWatch,
        client: kube.Kube,
        rv: str,
        on_listed: Callable[[], None] = lambda: None,
    ) -> None:
        self._inner = inner
        self._client = client
        self._rv = rv
        self._on_listed = on_listed
        self._first = True

    @property
    def description(self) -> str:
        return self._inner.description

    async def list(
        self, *, resource_version: str, limit: int | None, continue_token: str
    ) -> kube.ObjList:
        if self._first:
            self._first = False
            page = await self._client.list(
                kube.CONFIG_MAPS,
                namespace=NAMESPACE,
                resource_version=self._rv,
                resource_version_match="Exact",
            )
            self._on_listed()
            return page
        return await self._inner.list(
            resource_version=resource_version, limit=limit, continue_token=continue_token
        )

    def watch(
        self, *, resource_version: str, timeout_seconds: int, read_deadline: float
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[dict[str, Any]]]:
        return self._inner.watch(
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            read_deadline=read_deadline,
        )


async def informer_path(
    client: kube.Kube,
    rv: str,
    n: int,
    watch: Stopwatch,
    *,
    reconcile_keys: bool = True,
    registry: metrics.Metrics | None = None,
) -> None:
    """Replay the stream through an informer into a work queue; with `reconcile_keys` a
    controller with a no-op reconciler drains it, else the run ends when n keys were queued.
    With `registry`, the queue and the controller report to it, as in the operator."""
    sys_clock = clock.SystemClock()
    listing = listwatch.ListWatch(client, kube.CONFIG_MAPS, namespace=NAMESPACE)
    inf = informer.Informer(ReplayFrom(listing, client, rv, watch.start), clock=sys_clock)
    done: set[keys.ObjectKey] = set()
    all_done = asyncio.Event()

    async def noop(key: keys.ObjectKey) -> reconcile.Result:
        done.add(key)
        if len(done) >= n:
            all_done.set()
        return reconcile.Result()

    queue = workqueue.WorkQueue(
        "bench", clock=sys_clock, metrics=registry.workqueue("bench") if registry else None
    )
    inf.add_handler(handlers.enqueue_self(queue))
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(inf.run(), name="bench-informer")]
        if reconcile_keys:
            ctl = controller.Controller(
                "bench",
                reconcile.ReconcilerFunc(noop),
                queue,
                clock=sys_clock,
                metrics=registry.controller("bench") if registry else None,
            )
            tasks.append(tg.create_task(ctl.run(), name="bench-controller"))
        else:
            inf.add_handler(lambda ev: all_done.set() if len(queue) >= n else None)
        await all_done.wait()
        watch.stop()
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


async def measure_memory(source: listwatch.ListerWatcher, how: str) -> Memory:
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


# ------------------------------------------------------------------------- rates

BASELINE = "bare raw"
TYPED = "bare typed"
TARGET = "informer path"
NO_METRICS = "informer path, no metrics"
#: (key, label) of every variant, in report order.
VARIANTS = (
    (BASELINE, "bare kubernetes_asyncio loop, json.loads only"),
    (TYPED, "bare kubernetes_asyncio Watch (V1ConfigMap)"),
    ("informer queue", "informer -> queue (keys queued, no workers)"),
    (TARGET, "informer -> queue -> no-op reconciler"),
    (NO_METRICS, "  the same without metrics"),
)
Pairs = dict[str, list[tuple[Run, Run]]]
"""Per variant, per round: (its run, the baseline run next to it)."""


async def measure_rates(plane: ControlPlane, client: kube.Kube, rv: str, n: int) -> Pairs:
    """Every variant once per round, each beside a baseline run (module docstring)."""
    registry = metrics.Metrics()
    async with await raw_api(plane) as api:
        bodies: dict[str, Body] = {
            BASELINE: lambda w: bare_raw_loop(api, rv, n, w),
            TYPED: lambda w: bare_typed_loop(api, rv, n, w),
            "informer queue": lambda w: informer_path(client, rv, n, w, reconcile_keys=False),
            TARGET: lambda w: informer_path(client, rv, n, w, registry=registry),
            NO_METRICS: lambda w: informer_path(client, rv, n, w),
        }
        for label, body in bodies.items():
            if label != TYPED:  # slow, and nothing in it needs warming
                await body(Stopwatch())
        pairs: Pairs = {label: [] for label in bodies if label != BASELINE}
        for i in range(rounds()):
            for label, runs in pairs.items():
                if label == TYPED and i >= TYPED_ROUNDS:
                    continue
                if i % 2 == 0:
                    base = await timed(n, bodies[BASELINE])
                    run = await timed(n, bodies[label])
                else:
                    run = await timed(n, bodies[label])
                    base = await timed(n, bodies[BASELINE])
                runs.append((run, base))
    return pairs


# ------------------------------------------------------------------------- report


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report_rates(pairs: Pairs) -> None:
    print(f"median of {len(pairs[TARGET])} rounds ({TYPED_ROUNDS} for the typed loop)")
    print(
        f"{'consumer of the same watch stream':<46}{'events/s':>9}{'spread':>14}"
        f"{'CPU us/ev':>10}{'GC':>5}{'vs bare':>9}"
    )
    ratios: dict[str, float] = {BASELINE: 1.0}
    cpu: dict[str, float] = {}
    for key, label in VARIANTS:
        if key == BASELINE:
            runs = [base for rounds_of in pairs.values() for _, base in rounds_of]
        else:
            runs = [run for run, _ in pairs[key]]
            ratios[key] = statistics.median(run.rate / base.rate for run, base in pairs[key])
        rates = [r.rate for r in runs]
        cpu[key] = statistics.median(r.cpu_us_per_event for r in runs)
        gc_share = statistics.median(r.gc_share for r in runs)
        spread = f"{min(rates) / 1000:.1f}k..{max(rates) / 1000:.1f}k"
        print(
            f"{label:<46}{statistics.median(rates):>9.0f}{spread:>14}{cpu[key]:>10.1f}"
            f"{gc_share:>5.0%}{ratios[key]:>9.0%}"
        )
    for key, wiring in ((TARGET, "with metrics, as deployed"), (NO_METRICS, "without metrics")):
        print(
            f"target rate: informer path ({wiring}) >= {TARGET_RATE_RATIO:.0%} of the bare "
            f"loop's rate: {ratios[key]:.0%} -> {verdict(ratios[key] >= TARGET_RATE_RATIO)}  "
            f"(CPU per event {cpu[key] / cpu[BASELINE]:.1f}x the bare loop's)"
        )


def report_memory(memory: list[Memory], received: float) -> None:
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
    print(
        f"target memory: retained <= {TARGET_MEMORY_RATIO:.0f}x the JSON as received "
        f"({received:.0f} B, managedFields included): {worst:.2f}x "
        f"-> {verdict(worst <= TARGET_MEMORY_RATIO)}"
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
            load_before = os.getloadavg()[0]
            pairs = await measure_rates(plane, client, rv, n)
            load_after = os.getloadavg()[0]
            listing = listwatch.ListWatch(client, kube.CONFIG_MAPS, namespace=NAMESPACE)
            memory = [
                await measure_memory(listing, "LIST"),
                await measure_memory(ReplayFrom(listing, client, rv), "watch events"),
            ]
            received = await received_json_size(client)
        print(f"objects: {n}  (created in {create_s:.1f}s, {n / create_s:.0f}/s)")
        print(
            f"machine: {os.cpu_count()} CPUs; load average {load_before:.1f} before the timed "
            f"rounds, {load_after:.1f} after (wall rates swing with it, CPU per event less)"
        )
        report_rates(pairs)
        report_memory(memory, received)
        return 0
    finally:
        await asyncio.to_thread(plane.stop)
