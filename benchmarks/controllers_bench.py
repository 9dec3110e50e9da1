"""Cache controllers at scale: time and API requests to converge 100 caches on 50 nodes.

One run, one control plane (etcd + kube-apiserver, started here; no kube-controller-manager,
nothing here needs it). 50 Ready nodes in two node groups of 25, then the controllers start
in-process through the runtime Manager, then 100 caches are created at once (half
LocalModelCaches, half LocalModelNamespaceCaches in 5 namespaces, every one on both groups,
three cache URIs in four shared). The clock stops when every cache reports `copies.total`
equal to its member count (50), as seen by the controllers' own informer stores (so
watching for the end costs no request). `LOCALCACHE_BENCH_CACHES` and
`LOCALCACHE_BENCH_NODES` override the sizes.

Reported: wall-clock time to converge; the requests the controllers sent (per verb); the
write requests the apiserver served for our kinds and PVs/PVCs (`apiserver_request_total`);
and beside them two reference points computed for the same sizes: the floor (one finalizer
patch, one status patch and the download PV/PVC pairs per cache, one LocalModelNode create
per node) and the per-cache-per-node LocalModelNode writes of KServe's reconciler.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localcache.caching import config as config_mod
from localcache.controllers import setup as controllers_setup
from localcache.controllers import state
from localcache.devenv import crds
from localcache.devenv.controlplane import ControlPlane
from localcache.runtime import kube, manager, metrics
from localcache.runtime import logging as logging_mod

ROOT = Path(__file__).resolve().parents[1]
JOB_NAMESPACE = "kserve-localmodel-jobs"
GROUPS = ("gpu-a", "gpu-b")
TENANTS = 5
CONCURRENCY = 16
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")
_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Obj = dict[str, Any]


def sizes() -> tuple[int, int]:
    caches = int(os.environ.get("LOCALCACHE_BENCH_CACHES", "100"))
    nodes = int(os.environ.get("LOCALCACHE_BENCH_NODES", "50"))
    return caches, nodes


def server_writes(plane: ControlPlane) -> dict[str, int]:
    """Write requests served so far, per resource, from the apiserver's /metrics."""
    status, text = plane.rest("GET", "/metrics", timeout=30)
    if status != 200:
        raise RuntimeError(f"GET /metrics: {status}")
    out: dict[str, int] = {}
    for line in str(text).splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("verb") in WRITE_VERBS:
            resource = labels.get("resource", "")
            out[resource] = out.get(resource, 0) + int(float(match["value"]))
    return out


async def bounded(jobs: list[Any]) -> None:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(job: Any) -> None:
        async with limit:
            await job

    async with asyncio.TaskGroup() as tg:
        for index, job in enumerate(jobs):
            tg.create_task(one(job), name=f"bench-job-{index}")


def node_group(name: str) -> Obj:
    terms = [{"matchExpressions": [{"key": INSTANCE_TYPE, "operator": "In", "values": [name]}]}]
    return {
        "apiVersion": state.LOCAL_MODEL_NODE_GROUPS.api_version,
        "kind": state.LOCAL_MODEL_NODE_GROUPS.kind,
        "metadata": {"name": name},
        "spec": {
            "storageLimit": "1Ti",
            "persistentVolumeSpec": {
                "accessModes": ["ReadWriteOnce"],
                "capacity": {"storage": "100Gi"},
                "hostPath": {"path": "/models"},
                "storageClassName": "standard",
                "nodeAffinity": {"required": {"nodeSelectorTerms": terms}},
            },
            "persistentVolumeClaimSpec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "100Gi"}},
                "storageClassName": "standard",
            },
        },
    }


async def make_node(client: kube.Kube, name: str, group: str) -> None:
    await client.create(
        kube.NODES,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {INSTANCE_TYPE: group}},
        },
    )
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench"}
    await client.patch_status(
        kube.NODES, name, {"status": {"conditions": [ready]}}, patch_type="strategic"
    )


def cache(index: int) -> tuple[kube.Resource, Obj, str | None]:
    namespaced = index % 2 == 1
    namespace = f"tenant-{index % TENANTS}" if namespaced else None
    res = state.LOCAL_MODEL_NAMESPACE_CACHES if namespaced else state.LOCAL_MODEL_CACHES
    meta: Obj = {"name": f"model-{index}"}
    if namespace:
        meta["namespace"] = namespace
    uri = f"s3://bucket/model-{index}" if index % 4 else f"s3://bucket/shared-{index % 3}"
    body = {
        "apiVersion": res.api_version,
        "kind": res.kind,
        "metadata": meta,
        "spec": {"sourceModelUri": uri, "modelSize": "1Gi", "nodeGroups": list(GROUPS)},
    }
    return res, body, namespace


def converged(handle: controllers_setup.CacheControllers, caches: int, members: int) -> bool:
    seen = handle.stores.caches.list() + handle.stores.namespace_caches.list()
    done = sum(
        1 for obj in seen if ((obj.get("status") or {}).get("copies") or {}).get("total") == members
    )
    return done == caches


async def until(done: Callable[[], bool], manager_task: asyncio.Task[int]) -> None:
    """Poll `done` until it holds; fail at once if the manager exits first."""
    while not done():
        if manager_task.done():
            raise RuntimeError(f"manager exited with {manager_task.result()}")
        await asyncio.sleep(0.05)


async def run(plane: ControlPlane, n_caches: int, n_nodes: int) -> None:
    client = await kube.Kube.from_kubeconfig(plane.kubeconfig_path)
    controller_client = await kube.Kube.from_kubeconfig(plane.kubeconfig_path)
    async with client, controller_client:
        for ns in (JOB_NAMESPACE, *(f"tenant-{i}" for i in range(TENANTS))):
            await asyncio.to_thread(plane.create_namespace, ns)
        for group in GROUPS:
            await client.create(state.LOCAL_MODEL_NODE_GROUPS, node_group(group))
        await bounded(
            [make_node(client, f"node-{i}", GROUPS[i % len(GROUPS)]) for i in range(n_nodes)]
        )
        cfg = config_mod.parse_config({"localModel": json.dumps({"jobNamespace": JOB_NAMESPACE})})
        mgr = manager.Manager(handle_signals=False)
        handle = controllers_setup.setup(
            mgr, kube=controller_client, config=cfg, metrics=metrics.Metrics()
        )
        task = asyncio.create_task(mgr.run(), name="bench-manager")
        await until(mgr.started.is_set, task)
        before = await asyncio.to_thread(server_writes, plane)
        requests_before = dict(controller_client.requests)
        started = time.monotonic()
        await bounded(
            [
                client.create(res, body, namespace=ns)
                for res, body, ns in map(cache, range(n_caches))
            ]
        )
        created = time.monotonic() - started
        await until(lambda: converged(handle, n_caches, n_nodes), task)
        elapsed = time.monotonic() - started
        after = await asyncio.to_thread(server_writes, plane)
        sent = {
            verb: count - requests_before.get(verb, 0)
            for verb, count in controller_client.requests.items()
            if count - requests_before.get(verb, 0)
        }
        mgr.stop()
        await task
    report(n_caches, n_nodes, created, elapsed, sent, before, after)


def report(
    n_caches: int,
    n_nodes: int,
    created: float,
    elapsed: float,
    sent: dict[str, int],
    before: dict[str, int],
    after: dict[str, int],
) -> None:
    def delta(resource: str) -> int:
        return after.get(resource, 0) - before.get(resource, 0)

    kinds = [
        state.LOCAL_MODEL_NODES.plural,
        state.LOCAL_MODEL_CACHES.plural,
        state.LOCAL_MODEL_NAMESPACE_CACHES.plural,
        state.LOCAL_MODEL_NODE_GROUPS.plural,
        kube.PERSISTENT_VOLUMES.plural,
        kube.PERSISTENT_VOLUME_CLAIMS.plural,
        kube.EVENTS.plural,
    ]
    writes = {k: delta(k) for k in kinds}
    total_sent = sum(sent.values())
    floor = n_caches * (2 + 2 * len(GROUPS)) + n_nodes + len(GROUPS)
    kserve_lmn = n_caches * n_nodes
    print(
        f"{n_caches} caches x {n_nodes} nodes ({len(GROUPS)} groups, members per cache {n_nodes})"
    )
    print(f"caches created by the client in {created:.2f}s")
    print(
        f"converged (every cache copies.total = {n_nodes}) in {elapsed:.2f}s after the first create"
    )
    per_verb = ", ".join(f"{verb} {count}" for verb, count in sorted(sent.items()))
    print(f"API requests sent by the controllers: {total_sent} ({per_verb})")
    print("write requests served by the apiserver, per resource (caches' creates included):")
    for resource, count in writes.items():
        print(f"  {resource:<28}{count:>7}")
    ours = sum(sent.get(v, 0) for v in ("create", "update", "patch", "delete"))
    print(
        f"controller writes: {ours}; floor for these sizes: {floor}; "
        f"LocalModelNode writes {writes[state.LOCAL_MODEL_NODES.plural]} vs "
        f"{kserve_lmn} for a per-cache-per-node writer (KServe's shape)"
    )


async def main() -> None:
    logging_mod.configure(level="warning", renderer="console")
    n_caches, n_nodes = sizes()
    plane = ControlPlane(with_kcm=False)
    await asyncio.to_thread(plane.start)
    try:
        await asyncio.to_thread(
            crds.install_crds, plane, [ROOT / "manifests" / "crds", ROOT / "manifests" / "test"]
        )
        await run(plane, n_caches, n_nodes)
    finally:
        await asyncio.to_thread(plane.stop)


if __name__ == "__main__":
    asyncio.run(main())
