"""Cross-scope sharing after proof at the origin (issue 23, item 4), on the bed's two nodes,
as its users and its attackers meet it:

- tenant A's private `s3://` model is on both nodes (one from the origin, one from a peer), in
  a group whose `peerDistribution.proofOrigins` names the S3 store (one of its objects stored
  with a SHA-256 checksum, which the proof compares with the manifest, the others by ETag);
- tenant B, with valid but different credentials, caches the same URI: each of its nodes
  proves at the store (presigned HEADs its own download pod signs, run by the other node's
  agent) and then fetches the model from that node: the store serves B a listing and HEADs,
  not one object byte, and B's pods read the model; each node's file list then records the
  store's own SHA-256 of the object stored with one;
- tenant C, whose credentials read only a bucket of its own, forges proofs with the identity
  of its own download pod: HEADs signed with a wrong secret, its own valid signatures of the
  model's objects (which the store refuses it), valid signatures of its own objects, a
  reader's signatures that have expired, a reader's valid signatures made for the other
  node's nonce (relayed), and one proof sent twice: each is refused with its reason, C gets
  no byte from any peer, and its cache reports the store's refusal.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localcache.agent import jobstate
from localcache.agent.disk import filelists, layout
from localcache.agent.jobs import peerjob
from localcache.caching import jobfailures, keys
from localcache.runtime import clock
from tests.e2e.realnodes import objects, peers
from tests.e2e.realnodes.cluster import Cluster, Obj, Sources
from tests.e2e.realnodes.objects import LMNC

pytestmark = pytest.mark.timeout(900)
MIB = 1024 * 1024
PROBE_WINDOW_S = 40
"""How long the probe may take, at most, while none of C's downloads runs."""
DOWNLOADED = "ModelDownloaded"
PROOF_REASONS = {
    "wrong-secret": "proof-denied",
    "not-readable": "proof-denied",
    "another-object": "proof-object",
    "expired": "proof-expired",
    "other-node": "proof-nonce",
    "replay": "proof-nonce",
}


@dataclass
class Proofed:
    store: Any
    bucket: str
    uri: str
    key: str
    files: dict[str, bytes]
    group: str
    endpoint: str
    """The store as pods (and agents) reach it: host:port."""
    log: Path

    @property
    def origin(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def digests(self) -> dict[str, str]:
        return {p: hashlib.sha256(d).hexdigest() for p, d in self.files.items()}

    @property
    def size(self) -> int:
        return sum(len(d) for d in self.files.values())


def _tenant(cluster: Cluster, proofed: Proofed, prefix: str, key: Any) -> str:
    namespace = cluster.namespace(prefix)
    cluster.apply(
        *objects.s3_credentials(
            namespace, name="s3-reader", endpoint=proofed.endpoint,
            key_id=key.access_key_id, secret=key.secret_access_key,
        ),
        objects.cache("bert", proofed.uri, proofed.group, namespace=namespace,
                      service_account="s3-reader"),
    )  # fmt: skip
    return namespace


def _drop(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("delete", objects.ISVC.plural, "--all", "-n", namespace, check=False)
    cluster.kubectl(
        "delete", LMNC.plural, "bert", "-n", namespace, "--wait=true", "--timeout=90s",
        check=False,
    )  # fmt: skip
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def proofed(cluster: Cluster, sources: Sources) -> Iterator[Proofed]:
    store, endpoint = sources.require_s3()
    run = uuid.uuid4().hex[:6]
    bucket, group = f"proof-{run}", f"g-proof-{run}"
    files = {
        "config.json": b'{"arch": "bert", "proof": true}\n',
        "model.bin": os.urandom(2 * MIB),
        "tokenizer/vocab.txt": os.urandom(128 * 1024),
    }
    store.create_bucket(bucket)
    for path, data in files.items():  # one stored with its SHA-256: proved by it, not MD5
        store.put_object(bucket, f"bert/{path}", data, sha256=path == "model.bin")
    uri = f"s3://{bucket}/bert"
    assert store.log_path is not None
    found = Proofed(
        store, bucket, uri, keys.storage_key(uri), files, group, endpoint, store.log_path
    )
    cluster.apply(peers.peer_group(cluster, group, proofOrigins=[found.origin]))
    owner = _tenant(cluster, found, "proof-a", store.create_user(f"proof-a-{run}"))
    try:
        cluster.wait_ready(LMNC.plural, "bert", namespace=owner, timeout=240)
        cluster.wait(
            lambda: all(peers.served(cluster, n, found.key) for n in cluster.node_names),
            timeout=120,
            what=f"both nodes list {found.key} in status.peer.models",
        )
        yield found
    finally:
        _drop(cluster, owner)
        cluster.kubectl("delete", "localmodelnodegroup", group, "--wait=false", check=False)


def test_a_tenant_with_other_valid_credentials_is_served_by_peers_after_its_proof(
    cluster: Cluster, proofed: Proofed
) -> None:
    before = peers.s3_gets(proofed.log, proofed.bucket)
    heads_before = _heads(proofed)
    run = uuid.uuid4().hex[:6]
    tenant = _tenant(cluster, proofed, "proof-b", proofed.store.create_user(f"proof-b-{run}"))
    status_key = keys.status_key("bert", tenant)
    try:
        cached = cluster.wait_ready(LMNC.plural, "bert", namespace=tenant, timeout=240)
        assert cached["status"]["copies"]["available"] == len(cluster.node_names)
        for node in cluster.node_names:
            (other,) = (n for n in cluster.node_names if n != node)
            entry = peers.progress(cluster, node, status_key)
            assert entry.get("source") == f"peer/{other}", f"{node}: {entry}"
            assert entry.get("peerBytes") == proofed.size, f"{node}: {entry}"
            assert not entry.get("originBytes"), f"{node}: {entry}"
        # The store served B no object: a listing and one HEAD per file and node (the proof).
        assert peers.s3_gets(proofed.log, proofed.bucket) == before
        heads = _heads(proofed) - heads_before
        for path in proofed.files:
            assert heads[f"bert/{path}"] >= len(cluster.node_names), heads
        for job in peers.download_jobs(cluster, tenant, proofed.key):
            if peers.is_peer_job(job):
                args = job["spec"]["template"]["spec"]["containers"][0]["args"]
                assert args[args.index("--prove-s3") + 1] == proofed.uri, args
        # Same bytes, so one folder per node: B's scope was added to A's, no variant made.
        claim = peers.serving_claim(cluster, tenant, "bert", proofed.uri)
        for node in cluster.node_names:
            models = cluster.models_root(node) / layout.MODELS_DIR
            variants = [p.name for p in models.iterdir() if p.name.startswith(f"{proofed.key}.")]
            assert not variants, f"{node}: {variants}"
            seen = peers.files_through_pod(
                cluster, tenant, claim=claim, sub_path=layout.model_subpath(proofed.key),
                node=node,
            )  # fmt: skip
            assert seen == proofed.digests, f"the model as B's pod on {node} reads it"
        # Each node ran B's proof: the store's own SHA-256 of model.bin (stored with one) is
        # recorded in that node's file list; the files proven by their ETag have none.
        for node in cluster.node_names:
            cluster.wait(
                functools.partial(_origin_sums_recorded, cluster, proofed, node),
                timeout=60,
                what=f"{node}'s file list records the store's SHA-256 of model.bin",
            )
    finally:
        _drop(cluster, tenant)


def _origin_sums_recorded(cluster: Cluster, proofed: Proofed, node: str) -> bool:
    listed = filelists.read(cluster.models_root(node), proofed.key)
    recorded = {f.path: f.origin_sha256 for f in listed.manifest.files} if listed else {}
    want = {p: hashlib.sha256(d).hexdigest() if p == "model.bin" else None
            for p, d in proofed.files.items()}  # fmt: skip
    return recorded == want


def _heads(proofed: Proofed) -> Counter[str]:
    found: Counter[str] = Counter()
    for (method, key, code), count in peers.s3_requests(proofed.log, proofed.bucket).items():
        if method == "HEAD" and code == 200:
            found[key] += count
    return found


def test_a_tenant_forging_its_proof_gets_nothing(cluster: Cluster, proofed: Proofed) -> None:
    store = proofed.store
    run = uuid.uuid4().hex[:6]
    own_bucket = f"proof-c-{run}"
    store.create_bucket(own_bucket)
    for path, data in proofed.files.items():  # the same paths, its own (public-ish) bytes
        store.put_object(own_bucket, f"bert/{path}", data[::-1])
    own_only = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": "s3:*",
        "Resource": [f"arn:aws:s3:::{own_bucket}", f"arn:aws:s3:::{own_bucket}/*"]}]}  # fmt: skip
    forger = store.create_user(f"proof-c-{run}", policy=own_only)
    reader = store.create_user(f"proof-leaked-{run}")  # whose old signatures leaked
    tenant = _tenant(cluster, proofed, "proof-c", forger)
    status_key = keys.status_key("bert", tenant)
    try:
        _refused_by_the_store(cluster, tenant)
        probing_since = _between_attempts(cluster, tenant, proofed.key, status_key)
        _sidecars_took_their_sigterm(cluster, tenant, proofed.key)
        user = cluster.tenant(tenant)
        token = peers.download_pod_token(cluster, tenant, proofed.key, user=user)
        assert token, f"no download pod of {proofed.key} left in {tenant} to mint a token for"

        def spec(bucket: str, key: Any, **kw: Any) -> Obj:
            """A proof the probe presigns in C's pod with `key` (secret overridable), for
            the model's paths in `bucket`, with the nonce the target issues it."""
            return {
                "uri": proofed.uri, "bucket": bucket, "endpoint": proofed.origin,
                "keys": {p: f"bert/{p}" for p in proofed.files},
                "key_id": key.access_key_id, "secret": key.secret_access_key,
                "expires_s": 60, **kw,
            }  # fmt: skip

        proofs = {
            "wrong-secret": spec(proofed.bucket, forger, secret="x" * 40),
            "not-readable": spec(proofed.bucket, forger),
            "another-object": spec(own_bucket, forger),
            # a reader's signatures (valid ones: its keys leaked) that expired meanwhile
            "expired": spec(proofed.bucket, reader, signed_ago_s=120),
            # a reader's valid signatures, made for the other node's nonce, relayed here
            "other-node": spec(proofed.bucket, reader, nonce_from="other-node"),
            # the same proof twice: its nonce is spent by the first
            "replay": spec(proofed.bucket, forger, nonce_from="replay"),
        }
        probe = peers.probe_pod(
            "proof-probe", tenant, node=cluster.node_names[0], ca=peers.peer_ca(cluster),
            targets=peers.targets(cluster, proofed.key, list(proofed.files)),
            tokens={"download-pod": token}, proofs=proofs,
        )  # fmt: skip
        cluster.kubectl("create", "-f", "-", f"--as={user}", input_text=json.dumps(probe))
        rows = peers.probe_results(cluster, tenant, "proof-probe")
        probed_until = _finished(cluster, tenant, "proof-probe")
        retried = [
            j["metadata"]["name"]
            for j in peers.download_jobs(cluster, tenant, proofed.key)
            if probing_since <= _created(j) <= probed_until
        ]
        assert not retried, f"C's retries {retried} started while the probe ran"
        _nothing_but_refusals(rows, set(proofed.digests.values()))
        for node in cluster.node_names:
            entry = peers.progress(cluster, node, status_key)
            assert not entry.get("peerBytes"), f"C took peer bytes on {node}: {entry}"
            models = cluster.models_root(node) / layout.MODELS_DIR
            variants = [p.name for p in models.iterdir() if p.name.startswith(f"{proofed.key}.")]
            assert not variants, f"a folder of the forger on {node}: {variants}"
        counted = sum(
            peers.metric_total(
                peers.agent_metrics(cluster, n), "localcache_p2p_refusals_total", reason=reason
            )
            for n in cluster.node_names
            for reason in set(PROOF_REASONS.values())
        )
        assert counted >= len(PROOF_REASONS) * len(cluster.node_names), counted
    finally:
        _drop(cluster, tenant)


def _refused_by_the_store(cluster: Cluster, tenant: str) -> None:
    """C's cache ends in NodeDownloadError on every node, reporting the store's refusal."""

    def reported() -> bool:
        cache = cluster.get(LMNC.plural, "bert", namespace=tenant) or {}
        node_status = (cache.get("status") or {}).get("nodeStatus") or {}
        degraded = cluster.condition(cache, "Degraded") or {}
        return all(
            node_status.get(n) == "NodeDownloadError" for n in cluster.node_names
        ) and jobfailures.GIST_S3_FORBIDDEN in str(degraded.get("message"))

    cluster.wait(
        reported,
        timeout=240,
        what=f"C's cache shows NodeDownloadError on both nodes and "
        f"{jobfailures.GIST_S3_FORBIDDEN!r}",
    )


def _between_attempts(cluster: Cluster, tenant: str, storage_key: str, status_key: str) -> float:
    """Waits until C has no download Job running and every node retries it no sooner than
    `PROBE_WINDOW_S` from now; returns when (epoch seconds, whole). A node tracking C's own
    download in progress rightly answers C's token "nothing-yet" rather than "other-scope"."""

    def quiet() -> bool:
        now = time.time()
        for node in cluster.node_names:
            retry_at = peers.progress(cluster, node, status_key).get("nextRetryTime")
            if not retry_at or _epoch(retry_at) - now < PROBE_WINDOW_S:
                return False
        jobs = peers.download_jobs(cluster, tenant, storage_key)
        return all(jobstate.job_state(j).phase is not jobstate.JobPhase.ACTIVE for j in jobs)

    cluster.wait(
        quiet,
        timeout=300,
        what=f"C's download Jobs all ended, each node retrying {PROBE_WINDOW_S}s or more later",
    )
    return float(int(time.time()))


def _sidecars_took_their_sigterm(cluster: Cluster, tenant: str, storage_key: str) -> None:
    """The `origin-sums` sidecar of every seed of C, whose download the store refused at once,
    exited 0 on the kubelet's SIGTERM: one that dropped it, still loading as its container's
    PID 1, is killed at the end of the pod's grace, and the Job failed that much later."""
    ended = {
        pod["metadata"]["name"]: (state.get("state") or {}).get("terminated")
        for pod in cluster.items("pods", namespace=tenant, selector=f"storageKey={storage_key}")
        for state in (pod.get("status") or {}).get("initContainerStatuses") or []
        if state["name"] == peerjob.SUMS_CONTAINER
    }
    assert ended, f"no seed of C in {tenant} ran the {peerjob.SUMS_CONTAINER} sidecar"
    killed = {pod: end for pod, end in ended.items() if not end or end.get("exitCode") != 0}
    assert not killed, f"sidecars not ended by their SIGTERM: {json.dumps(killed)}"


def _finished(cluster: Cluster, namespace: str, pod: str) -> float:
    """When the (finished) `pod`'s last container ended."""
    got = cluster.get("pod", pod, namespace=namespace) or {}
    ends = [
        _epoch(state["state"]["terminated"]["finishedAt"])
        for state in (got.get("status") or {}).get("containerStatuses") or []
        if (state.get("state") or {}).get("terminated")
    ]
    assert ends, f"the probe {namespace}/{pod} has no ended container: {got.get('status')}"
    return max(ends)


def _created(job: Obj) -> float:
    return _epoch(job["metadata"]["creationTimestamp"])


def _epoch(stamp: str) -> float:
    parsed = clock.parse_rfc3339(stamp)
    assert parsed is not None, f"not an RFC 3339 time: {stamp!r}"
    return parsed.timestamp()


def _nothing_but_refusals(rows: list[Obj], digests: set[str]) -> None:
    """Every proof refused with its reason (401 without a valid token, 403 for the probe's own
    token, which is no download pod's), every manifest and file refused, no byte of the model."""
    leaked = [r for r in rows if r.get("status") in (200, 206) or r.get("sha256") in digests]
    assert not leaked, f"the forger got something: {json.dumps(leaked)}"
    want_status = {"none": 401, "garbage": 401, "default-audience": 401, "peer-audience": 403,
                   "download-pod": 403}  # fmt: skip
    wrong = [r for r in rows if r.get("status") != want_status.get(r["token"])]
    assert not wrong, f"unexpected answers: {json.dumps(wrong)}"
    for name, reason in PROOF_REASONS.items():
        got = [r for r in rows if r["token"] == "download-pod" and r["what"] == f"proof {name}"]
        assert got, f"the probe never sent the {name} proof"
        assert all(reason in str(r.get("text")) for r in got), f"{name}: {json.dumps(got)}"
    opened = [r for r in rows if r["token"] == "download-pod" and not r["what"].startswith("proof")]
    assert all("other-scope" in str(r.get("text")) for r in opened), json.dumps(opened)
