"""The peer server's authorization against the real apiserver (issue 23): a real pod-bound
ServiceAccount token (TokenRequest, audience `localcache-peer`) is reviewed with TokenReview,
its pod listed, its controller Job matched by uid against the `status.downloadJobs` records of
the LocalModelNode of the pod's node, and the record's scope against the folder's scopes.

No kubelet runs: the pods are objects only (a token bound to a pod is valid while the pod
exists). Each case goes through the peer server over TLS on 127.0.0.1, and its refusal reason
is read from `localcache_p2p_refusals_total`."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from localcache.agent.peer import auth, server, throttle
from localcache.api import groupversion, peer
from localcache.devenv.controlplane import ControlPlane
from localcache.runtime import apitypes, kube, metrics
from localcache.runtime.serving import certgen

Obj = dict[str, Any]
KEY = "00112233445566ff"
SCOPE = "a" * 64
OTHER_SCOPE = "b" * 64
DATA = b"peer bytes " * 100
LMN = groupversion.LOCAL_MODEL_NODE.api


@dataclass
class Cluster:
    plane: ControlPlane
    kube: kube.Kube
    namespace: str
    node: str
    records: list[Obj]

    def rest(self, method: str, path: str, body: Any = None) -> Obj:
        status, answer = self.plane.rest(method, path, body)
        assert status in (200, 201), f"{method} {path}: {status} {answer}"
        assert isinstance(answer, dict)
        return answer

    async def job(self, name: str) -> Obj:
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "fetch", "image": "localcache"}],
                    }
                },
            },
        }
        return await self.kube.create(apitypes.JOBS, body)

    async def pod(self, name: str, *, job: Obj | None) -> Obj:
        """A pod object on `node` (owned by `job`, labelled as the Job controller's own so it
        adopts rather than releases it)."""
        metadata: Obj = {"name": name, "namespace": self.namespace}
        if job is not None:
            uid, job_name = job["metadata"]["uid"], job["metadata"]["name"]
            metadata["labels"] = {
                "batch.kubernetes.io/controller-uid": uid,
                "controller-uid": uid,
                "batch.kubernetes.io/job-name": job_name,
                "job-name": job_name,
            }
            metadata["ownerReferences"] = [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job_name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {
                "nodeName": self.node,
                "serviceAccountName": "fetcher",
                "automountServiceAccountToken": False,
                "restartPolicy": "Never",
                "containers": [{"name": "fetch", "image": "localcache"}],
            },
        }
        return await self.kube.create(apitypes.PODS, body)

    async def token(self, pod: Obj, *, audience: str = peer.TOKEN_AUDIENCE) -> str:
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience],
                "expirationSeconds": 600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                },
            },
        }
        path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/fetcher/token"
        answer = await asyncio.to_thread(self.rest, "POST", path, request)
        return str(answer["status"]["token"])

    async def record(self, job: Obj, *, uid: str | None = None, scope: str = SCOPE) -> None:
        """Record `job` in the node's status.downloadJobs, as the agent does."""
        self.records.append(
            {
                "namespace": self.namespace,
                "name": job["metadata"]["name"],
                "uid": uid or job["metadata"]["uid"],
                "statusKey": "m",
                "storageKey": KEY,
                "scope": scope,
                "attempt": 0,
            }
        )
        patch = {"status": {"downloadJobs": self.records}}
        await self.kube.patch_status(LMN, self.node, patch)


@pytest.fixture
async def cluster(
    control_plane: ControlPlane, crds: list[str], namespace: str
) -> AsyncIterator[Cluster]:
    client = await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path)
    node = f"node-{uuid.uuid4().hex[:8]}"
    await client.create(
        LMN,
        {
            "apiVersion": LMN.api_version,
            "kind": LMN.kind,
            "metadata": {"name": node},
            "spec": {"localModels": []},
        },
    )
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "fetcher"}}
    await client.create(apitypes.SERVICE_ACCOUNTS, sa, namespace=namespace)
    try:
        yield Cluster(control_plane, client, namespace, node, [])
    finally:
        await client.delete(LMN, node)
        await client.close()


@dataclass
class Peer:
    url: str
    registry: metrics.Metrics
    session: aiohttp.ClientSession

    async def fetch(self, token: str) -> int:
        headers = {"Authorization": f"Bearer {token}"}
        url = f"{self.url}/files/model.bin"
        async with self.session.get(url, headers=headers, server_hostname=peer.SERVER_NAME) as r:
            if r.status == 200:
                assert await r.read() == DATA
            return r.status

    def refused(self, reason: str) -> float:
        return self.registry.value("localcache_p2p_refusals_total", reason=reason) or 0.0


class OneFolder:
    def __init__(self, served: server.ServedFolder) -> None:
        self.served = served

    def scopes(self, storage_key: str) -> frozenset[str]:
        return self.served.scopes if storage_key == KEY else frozenset()

    def lookup(self, storage_key: str, scope: str) -> server.ServedFolder | None:
        return self.served if storage_key == KEY and scope in self.served.scopes else None

    def complete(self, storage_key: str) -> server.ServedFolder | None:
        return self.served if storage_key == KEY else None


@pytest.fixture
async def peer_server(cluster: Cluster, tmp_path: Path) -> AsyncIterator[Peer]:
    folder = tmp_path / "models" / "folder"
    folder.mkdir(parents=True)
    (folder / "model.bin").write_bytes(DATA)
    entry = peer.ManifestFile(
        path="model.bin", size=len(DATA), sha256=hashlib.sha256(DATA).hexdigest()
    )
    digest = peer.manifest_digest(files=[(entry.path, entry.size, entry.sha256)])
    manifest = peer.PeerManifest(storage_key=KEY, digest=digest, files=[entry])
    registry = metrics.Metrics()
    srv = server.PeerServer(
        folders=OneFolder(server.ServedFolder(folder, manifest, frozenset({SCOPE}))),
        authorizer=auth.Authorizer(auth.KubeAuthApi(cluster.kube)),
        slots=throttle.UploadSlots(lambda: 4),
        bucket=throttle.TokenBucket(lambda: None),
        metrics=registry.peer(),
    )
    bundle = certgen.issue_bundle([peer.SERVER_NAME], now=datetime.datetime.now(datetime.UTC))
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    (tmp_path / "tls.crt").write_bytes(bundle.cert_pem)
    (tmp_path / "tls.key").write_bytes(bundle.key_pem)
    server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    port = await srv.start("127.0.0.1", 0, server_ctx)
    client_ctx = ssl.create_default_context(cadata=bundle.ca_cert_pem.decode())
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx))
    try:
        yield Peer(f"https://127.0.0.1:{port}{peer.WIRE_PREFIX}/models/{KEY}", registry, session)
    finally:
        await session.close()
        await srv.stop()


async def test_the_pod_of_a_recorded_job_is_served(cluster: Cluster, peer_server: Peer) -> None:
    job = await cluster.job("dl-ok")
    await cluster.record(job)
    pod = await cluster.pod("dl-ok-pod", job=job)
    assert await peer_server.fetch(await cluster.token(pod)) == 200


async def test_a_token_for_another_audience_is_refused(cluster: Cluster, peer_server: Peer) -> None:
    job = await cluster.job("dl-aud")
    await cluster.record(job)
    pod = await cluster.pod("dl-aud-pod", job=job)
    token = await cluster.token(pod, audience="https://kubernetes.default.svc")
    assert await peer_server.fetch(token) == 401
    assert peer_server.refused("bad-token") + peer_server.refused("wrong-audience") == 1


async def test_pods_not_owned_by_a_recorded_job_are_refused(
    cluster: Cluster, peer_server: Peer
) -> None:
    recorded = await cluster.job("dl-recorded")
    await cluster.record(recorded)
    other = await cluster.job("dl-other")  # a tenant's own Job, not recorded
    assert await peer_server.fetch(await cluster.token(await cluster.pod("p1", job=other))) == 403
    assert peer_server.refused("untrusted-job") == 1
    bare = await cluster.pod("p2", job=None)
    assert await peer_server.fetch(await cluster.token(bare)) == 403
    assert peer_server.refused("not-a-download-job") == 1


async def test_a_forged_job_of_the_recorded_name_is_refused(
    cluster: Cluster, peer_server: Peer
) -> None:
    forged = await cluster.job("dl-forged")
    await cluster.record(forged, uid=str(uuid.uuid4()))  # the agent's Job had another uid
    pod = await cluster.pod("dl-forged-pod", job=forged)
    assert await peer_server.fetch(await cluster.token(pod)) == 403
    assert peer_server.refused("untrusted-job") == 1


async def test_a_record_of_another_scope_is_refused(cluster: Cluster, peer_server: Peer) -> None:
    job = await cluster.job("dl-scope")
    await cluster.record(job, scope=OTHER_SCOPE)
    pod = await cluster.pod("dl-scope-pod", job=job)
    assert await peer_server.fetch(await cluster.token(pod)) == 403
    assert peer_server.refused("other-scope") == 1
