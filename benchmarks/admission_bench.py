"""Admission throughput and latency over TLS on loopback, beside a bare aiohttp baseline.

Two servers run in the same process and the same run, each behind a TLS site with a TinyCA
certificate: the `AdmissionServer` with the production InferenceService mutation handler
(`webhooks.isvchandler.IsvcMutator` over in-memory stores of 60 caches: longest matching URI,
labels, annotations, the no-copy-yet warning), and a bare aiohttp handler that reads the body and
returns a fixed allowed AdmissionReview. A keep-alive client sends realistic InferenceService
AdmissionReviews with a fixed concurrency, bounded by a request count and a wall-clock limit,
and reports requests per second and p50/p99 latency for each. Client and servers share one
event loop (and this machine's cores),
so absolute numbers are a floor; the ratio between the two rows is the point.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from localcache.devenv import certs
from localcache.runtime import logging as logging_mod
from localcache.runtime import metrics, store
from localcache.runtime.serving import admission
from localcache.runtime.serving import tls as tls_mod
from localcache.webhooks import isvc, isvchandler

PATH = isvc.MUTATE_PATH
GROUP = "gpu"


def _cache(name: str, uri: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "resourceVersion": "1"}
    kind = "LocalModelCache"
    if namespace:
        meta["namespace"] = namespace
        kind = "LocalModelNamespaceCache"
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": kind,
        "metadata": meta,
        "spec": {"sourceModelUri": uri, "modelSize": "1Gi", "nodeGroups": [GROUP]},
        "status": {"copies": {"available": 0, "total": 2}},
    }


def real_mutator() -> isvchandler.IsvcMutator:
    """The production ISVC mutation handler over in-memory stores: 50 cluster caches, 10
    namespace caches in the ISVCs' namespace, one node group (what an informer would hold)."""
    caches, namespace_caches, groups = store.Store(), store.Store(), store.Store()
    for i in range(50):
        caches.upsert(_cache(f"cache-{i}", f"s3://models/team-{i % 7}/model-{i}"))
    for i in range(10):
        uri = f"s3://models/team-{i % 7}/model-{i}/v1"
        namespace_caches.upsert(_cache(f"ns-cache-{i}", uri, namespace="models"))
    groups.upsert(
        {
            "apiVersion": "serving.kserve.io/v1alpha1",
            "kind": "LocalModelNodeGroup",
            "metadata": {"name": GROUP},
            "spec": {"storageLimit": "100Gi"},
        }
    )
    return isvchandler.IsvcMutator(
        caches=caches.view(),
        namespace_caches=namespace_caches.view(),
        node_groups=groups.view(),
        enabled=lambda: True,
        synced=lambda: True,
    )


def isvc_review(i: int) -> bytes:
    """An AdmissionReview for an InferenceService CREATE, about 2 KiB like a real one."""
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": f"isvc-{i}",
            "namespace": "models",
            "labels": {"team": f"team-{i % 7}", "app.kubernetes.io/part-of": "bench"},
            "annotations": {"serving.kserve.io/deploymentMode": "RawDeployment"},
        },
        "spec": {
            "predictor": {
                "minReplicas": 1,
                "model": {
                    "modelFormat": {"name": "sklearn"},
                    "storageUri": f"s3://models/team-{i % 7}/model-{i % 50}/v{i % 3}",
                    "resources": {
                        "limits": {"cpu": "1", "memory": "2Gi"},
                        "requests": {"cpu": "100m", "memory": "512Mi"},
                    },
                    "env": [{"name": f"VAR_{j}", "value": "x" * 40} for j in range(12)],
                },
            }
        },
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"00000000-0000-0000-0000-{i:012d}",
            "kind": {
                "group": "serving.kserve.io",
                "version": "v1beta1",
                "kind": "InferenceService",
            },
            "resource": {
                "group": "serving.kserve.io",
                "version": "v1beta1",
                "resource": "inferenceservices",
            },
            "namespace": "models",
            "name": f"isvc-{i}",
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": isvc,
            "oldObject": None,
            "dryRun": False,
        },
    }
    return json.dumps(review).encode()


_FIXED = json.dumps(
    {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "fixed", "allowed": True},
    }
).encode()


async def _bare(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=_FIXED, content_type="application/json")


@dataclass(frozen=True)
class Result:
    name: str
    latencies: Sequence[float]
    seconds: float

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def percentile(self, q: int) -> float:
        cuts = statistics.quantiles(self.latencies, n=100, method="inclusive")
        return cuts[q - 1]

    def row(self) -> str:
        p50, p99 = self.percentile(50) * 1e3, self.percentile(99) * 1e3
        return f"{self.name:<34} {len(self.latencies):>7} {self.rps:>9.0f} {p50:>9.2f} {p99:>9.2f}"


async def measure(
    name: str,
    url: str,
    ca_pem: bytes,
    *,
    requests: int,
    concurrency: int,
    max_seconds: float,
) -> Result:
    """POST `requests` reviews (after a warm-up) with `concurrency` workers, or stop at
    `max_seconds`; every response must be 200."""
    bodies = [isvc_review(i) for i in range(256)]
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    latencies: list[float] = []
    headers = {"Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=10)
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=ctx)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(i: int) -> float:
            started = time.perf_counter()
            async with session.post(url, data=bodies[i % len(bodies)], headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{name}: HTTP {resp.status}")
            return time.perf_counter() - started

        for i in range(concurrency * 4):  # warm-up: TLS handshakes, caches
            await one(i)
        next_index = iter(range(requests))
        deadline = time.perf_counter() + max_seconds

        async def worker() -> None:
            for i in next_index:
                if time.perf_counter() > deadline:
                    return
                latencies.append(await one(i))

        began = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for w in range(concurrency):
                group.create_task(worker(), name=f"bench-{name}-{w}")
        elapsed = time.perf_counter() - began
    return Result(name, latencies, elapsed)


@contextlib.asynccontextmanager
async def _tls_site(app: web.Application, cert_dir: Path) -> AsyncIterator[int]:
    tls = tls_mod.ReloadableTLS(cert_dir / "tls.crt", cert_dir / "tls.key")
    async with tls_mod.serve(app, host="127.0.0.1", port=0, ssl_context=tls.context) as port:
        yield port


async def run(
    handler: admission.Handler | None = None,
    *,
    requests: int = 3000,
    concurrency: int = 8,
    max_seconds: float = 20.0,
) -> tuple[Result, Result]:
    """(admission server with `handler`, bare aiohttp baseline), measured back to back."""
    ca = certs.TinyCA("localcache-bench-ca")
    pair = ca.serving_cert(["127.0.0.1"])
    server = admission.AdmissionServer(metrics=metrics.Metrics())
    server.register(PATH, handler or real_mutator())
    bare = web.Application()
    bare.router.add_post(PATH, _bare)
    with tempfile.TemporaryDirectory(prefix="localcache-bench-") as tmp:
        cert_dir = Path(tmp)
        (cert_dir / "tls.crt").write_bytes(pair.cert_pem)
        (cert_dir / "tls.key").write_bytes(pair.key_pem)
        bounds: dict[str, Any] = {
            "requests": requests,
            "concurrency": concurrency,
            "max_seconds": max_seconds,
        }
        async with _tls_site(server.app(), cert_dir) as port:
            url = f"https://127.0.0.1:{port}{PATH}"
            ours = await measure("admission (ISVC mutation)", url, ca.cert_pem, **bounds)
        async with _tls_site(bare, cert_dir) as port:
            url = f"https://127.0.0.1:{port}{PATH}"
            baseline = await measure("bare aiohttp TLS (fixed allow)", url, ca.cert_pem, **bounds)
    return ours, baseline


async def main() -> None:
    logging_mod.configure(level="info")
    ours, baseline = await run()
    print("admission webhook over TLS, loopback, same run (client shares the event loop)")
    print(f"{'server':<34} {'requests':>7} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9}")
    print(ours.row())
    print(baseline.row())
    print(f"admission/baseline throughput: {ours.rps / baseline.rps:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
