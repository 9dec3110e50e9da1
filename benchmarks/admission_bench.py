"""Admission throughput and latency over TLS on loopback, beside a bare aiohttp baseline.

Two servers run in the same process and the same run, each behind a TLS site with a TinyCA
certificate: the `AdmissionServer` with a pluggable handler (by default a mutation-like one:
longest-prefix match of the ISVC storage URI over a set of caches, then a metadata JSON patch),
and a bare aiohttp handler that reads the body and returns a fixed allowed AdmissionReview.
A keep-alive client sends realistic InferenceService AdmissionReviews with a fixed concurrency,
bounded by a request count and a wall-clock limit, and reports requests per second and
p50/p99 latency for each. Client and servers share one event loop (and this machine's cores),
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

from localcache.runtime import admission, metrics
from localcache.runtime import logging as logging_mod
from localcache.runtime.testing import certs

PATH = "/mutate-serving-kserve-io-v1beta1-inferenceservice"
CACHES = {f"cache-{i}": f"s3://models/team-{i % 7}/model-{i}" for i in range(50)}
LABEL = "internal.serving.kserve.io/localmodel"
SOURCE = "internal.serving.kserve.io/localmodel-sourceuri"
PVC = "internal.serving.kserve.io/localmodel-pvc-name"


async def mutation_like(req: admission.Request) -> admission.Response:
    """Stand-in for the ISVC mutation: longest matching cache URI, then labels/annotations."""
    obj = req.object or {}
    uri = (((obj.get("spec") or {}).get("predictor") or {}).get("model") or {}).get("storageUri")
    best = ""
    if isinstance(uri, str):
        for name, cached in CACHES.items():
            if (uri == cached or uri.startswith(cached.rstrip("/") + "/")) and len(cached) > len(
                CACHES.get(best, "")
            ):
                best = name
    if not best:
        return admission.patched(admission.metadata_patch(obj, labels={LABEL: None}))
    ops = admission.metadata_patch(
        obj,
        labels={LABEL: best},
        annotations={SOURCE: CACHES[best], PVC: f"{best}-gpu"},
    )
    return admission.patched(ops, warnings=[f"LocalModelCache {best} has no downloaded copy yet"])


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
    tls = admission.ReloadableTLS(cert_dir / "tls.crt", cert_dir / "tls.key")
    async with admission.serve(app, host="127.0.0.1", port=0, ssl_context=tls.context) as port:
        yield port


async def run(
    handler: admission.Handler = mutation_like,
    *,
    requests: int = 3000,
    concurrency: int = 8,
    max_seconds: float = 20.0,
) -> tuple[Result, Result]:
    """(admission server with `handler`, bare aiohttp baseline), measured back to back."""
    ca = certs.TinyCA("localcache-bench-ca")
    pair = ca.serving_cert(["127.0.0.1"])
    server = admission.AdmissionServer(metrics=metrics.Metrics())
    server.register(PATH, handler)
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
            ours = await measure("admission (mutation-like handler)", url, ca.cert_pem, **bounds)
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
