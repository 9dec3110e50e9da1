"""The peer data plane on real nodes (issue 23, "What it must show"), as its users and its
attackers meet it, on the bed's two nodes:

- mode off (`peerDistribution.enabled: false`; it is on by default): the download Jobs are
  today's (storage initializer image, no peer label, token volume or CA) and nothing of
  `status.peer` or per-model sources appears;
- one credential scope, two nodes: one node downloads from the origin, the other from it
  (`source: peer/<first node>`), the S3 store serves each object once, both nodes' files read
  through a pod are the model's;
- a tenant whose credentials the store refuses, same URI and group: no byte from any peer or
  the origin, its cache reports the store's refusal;
- callers of an agent's peer endpoint from a tenant's pod (no token, a garbage token, its
  default token, its own `localcache-peer` token) and from a forged download-shaped Job are
  refused (401/403) and get no byte;
- one flipped byte in the serving node's copy: the node that fetches again never promotes a
  corrupted copy, the bad source is named in a `PeerSourceRejected` Event and counted in the
  joining agent's `localcache_p2p_verify_failures_total`, the copy's bytes come from the
  origin (the same Job takes the file from there: an http model);
- the serving node's agent killed mid-transfer: every node ends with a verified copy, and the
  broken file is finished from the origin by Range (the bed's other node was the only
  source): every byte crossed once, none restarted from byte 0, said as a fallback (from the
  next *peer*, with a third node: test_peer_resume).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from localcache.agent.disk import digest, layout
from localcache.api import groupversion
from localcache.api import peer as peer_api
from localcache.caching import jobfailures, keys
from tests.e2e.realnodes import objects, peers
from tests.e2e.realnodes.cluster import (
    GROUP_LABEL,
    JOBS_NS,
    STORAGE_INITIALIZER_IMAGE,
    SYSTEM_NS,
    Cluster,
    Obj,
    Sources,
    tree_digests,
)
from tests.e2e.realnodes.objects import LMC, LMNC

pytestmark = pytest.mark.timeout(420)
MIB = 1024 * 1024
DOWNLOADED = "ModelDownloaded"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _content_digest(files: dict[str, bytes]) -> str:
    dirs = {str(Path(p).parents[i]) for p in files for i in range(len(Path(p).parts) - 1)}
    return peer_api.manifest_digest(
        files=((p, len(d), _sha(d)) for p, d in files.items()), dirs=dirs
    )


@pytest.fixture
def labelled(cluster: Cluster) -> Iterator[str]:
    """A fresh value of the e2e group label, removed from every node afterwards."""
    value = uuid.uuid4().hex[:8]
    yield value
    for node in cluster.node_names:
        cluster.kubectl("label", "node", node, f"{GROUP_LABEL}-", check=False)


# ------------------------------------------------------------------------------ mode off


def test_with_the_mode_off_download_jobs_and_status_are_todays(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    name, group = f"off-{run}", f"g-off-{run}"
    sources.add_file(f"{name}/model.bin", os.urandom(256 * 1024))
    uri = f"{sources.http_base}/{name}/model.bin"
    key = keys.storage_key(uri)
    off = cluster.node_group(group)
    off["spec"]["peerDistribution"] = {"enabled": False}  # on by default
    cluster.apply(off, objects.cache(name, uri, group))
    try:
        cluster.wait_ready(LMC.plural, name, timeout=180)
        jobs = peers.download_jobs(cluster, JOBS_NS, key)
        assert jobs, f"no download Job of {key} in {JOBS_NS}"
        for job in jobs:
            where = job["metadata"]["name"]
            assert peers.peer_traits(job) == [], f"{where} has peer traits"
            containers = job["spec"]["template"]["spec"]["containers"]
            assert [c["image"] for c in containers] == [STORAGE_INITIALIZER_IMAGE], where
            assert containers[0]["args"] == [uri, "/mnt/models"], where
        enabled = [
            g["metadata"]["name"]
            for g in cluster.items(groupversion.LOCAL_MODEL_NODE_GROUP.plural)
            if ((g.get("spec") or {}).get("peerDistribution") or {}).get("enabled")
        ]
        for node in cluster.node_names:
            entry = peers.progress(cluster, node, name)
            extra = {k: entry[k] for k in ("source", "originBytes", "peerBytes") if k in entry}
            assert not extra, f"{node} reports peer fields for {name}: {extra}"
            status = peers.lmn_status(cluster, node)
            if not enabled:
                assert "peer" not in status, f"{node} publishes status.peer: {status['peer']}"
            assert peers.served(cluster, node, key) is None, f"{node} serves {key} to peers"
    finally:
        cluster.kubectl("delete", LMC.plural, name, "--wait=true", "--timeout=90s", check=False)
        cluster.kubectl("delete", "localmodelnodegroup", group, "--wait=false", check=False)


# ------------------------------------------------------------------ one scope, two nodes


@dataclass
class Scoped:
    """A namespace cache of a private s3:// model, with valid credentials, in a node group
    over both nodes with peer distribution on."""

    bucket: str
    uri: str
    key: str
    files: dict[str, bytes]
    group: str
    namespace: str
    endpoint: str
    log: Path

    @property
    def status_key(self) -> str:
        return keys.status_key("bert", self.namespace)

    @property
    def size(self) -> int:
        return sum(len(d) for d in self.files.values())

    @property
    def digests(self) -> dict[str, str]:
        return {p: _sha(d) for p, d in self.files.items()}


@pytest.fixture(scope="module")
def scoped(cluster: Cluster, sources: Sources) -> Iterator[Scoped]:
    store, endpoint = sources.require_s3()
    run = uuid.uuid4().hex[:6]
    bucket = f"peer-{run}"
    files = {
        "config.json": b'{"arch": "bert", "peer": true}\n',
        "model.bin": os.urandom(3 * MIB),  # below boto3's multipart threshold: one GET each
        "tokenizer/vocab.txt": os.urandom(256 * 1024),
    }
    store.create_bucket(bucket)
    for path, data in files.items():
        store.put_object(bucket, f"bert/{path}", data)
    group = f"g-peer-{run}"
    namespace = cluster.namespace("peer-a")
    key_id, secret = store.create_user(f"peer-a-{run}")
    uri = f"s3://{bucket}/bert"
    cluster.apply(
        peers.peer_group(cluster, group),
        *objects.s3_credentials(
            namespace, name="s3-reader", endpoint=endpoint, key_id=key_id, secret=secret
        ),
        objects.cache("bert", uri, group, namespace=namespace, service_account="s3-reader"),
    )
    assert store.log_path is not None
    try:
        yield Scoped(
            bucket, uri, keys.storage_key(uri), files, group, namespace, endpoint, store.log_path
        )
    finally:
        cluster.kubectl("delete", objects.ISVC.plural, "--all", "-n", namespace, check=False)
        cluster.kubectl(
            "delete",
            LMNC.plural,
            "bert",
            "-n",
            namespace,
            "--wait=true",
            "--timeout=90s",
            check=False,
        )
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "localmodelnodegroup", group, "--wait=false", check=False)


def _ready_and_served(cluster: Cluster, scoped: Scoped) -> None:
    cached = cluster.wait_ready(LMNC.plural, "bert", namespace=scoped.namespace, timeout=240)
    assert cached["status"]["copies"]["available"] == len(cluster.node_names), cached["status"]
    cluster.wait(
        lambda: all(peers.served(cluster, n, scoped.key) for n in cluster.node_names),
        timeout=120,
        what=f"both nodes list {scoped.key} in status.peer.models",
    )


def test_one_node_downloads_from_the_origin_and_the_other_from_that_node(
    cluster: Cluster, scoped: Scoped
) -> None:
    _ready_and_served(cluster, scoped)
    entries = {n: peers.progress(cluster, n, scoped.status_key) for n in cluster.node_names}
    origins = [n for n, e in entries.items() if e.get("source") == "origin"]
    assert len(origins) == 1, f"not exactly one node from the origin: {entries}"
    origin = origins[0]
    (other,) = (n for n in cluster.node_names if n != origin)
    assert entries[other].get("source") == f"peer/{origin}", entries
    assert entries[other].get("peerBytes") == scoped.size, entries[other]
    assert not entries[other].get("originBytes"), entries[other]
    assert not entries[origin].get("peerBytes"), entries[origin]
    assert entries[origin].get("originBytes") == scoped.size, entries[origin]

    # The origin's own count: each object read once (the origin node's download).
    gets = peers.s3_gets(scoped.log, scoped.bucket)
    assert gets == Counter({f"bert/{p}": 1 for p in scoped.files}), gets

    # Both nodes publish the content digest of the model's bytes, and hold those bytes.
    want = _content_digest(scoped.files)
    for node in cluster.node_names:
        published = peers.served(cluster, node, scoped.key) or {}
        assert published.get("digest") == want, f"{node} publishes {published}"
        assert published.get("bytes") == scoped.size, published
        folder = cluster.models_root(node) / layout.model_subpath(scoped.key)
        assert digest.tree_digest(folder) == want, f"{node}'s folder"
    claim = peers.serving_claim(cluster, scoped.namespace, "bert", scoped.uri)
    for node in cluster.node_names:
        seen = peers.files_through_pod(
            cluster,
            scoped.namespace,
            claim=claim,
            sub_path=layout.model_subpath(scoped.key),
            node=node,
        )
        assert seen == scoped.digests, f"the model as a pod on {node} reads it"


def test_a_tenant_the_store_refuses_gets_nothing_from_peers_and_sees_the_refusal(
    cluster: Cluster, scoped: Scoped
) -> None:
    _ready_and_served(cluster, scoped)
    before = peers.s3_gets(scoped.log, scoped.bucket)
    tenant = cluster.namespace("peer-refused")
    b_key = keys.status_key("bert", tenant)
    cluster.apply(
        *objects.s3_credentials(
            tenant,
            name="s3-reader",
            endpoint=scoped.endpoint,
            key_id="AKIAPEERREFUSED00000",
            secret="not-a-valid-secret",
        ),
        objects.cache(
            "bert", scoped.uri, scoped.group, namespace=tenant, service_account="s3-reader"
        ),
    )
    peer_jobs: dict[str, list[Obj]] = {}
    try:
        _borrowed_download_identity_is_refused(cluster, scoped, tenant)

        def refused_everywhere() -> bool:
            for node in cluster.node_names:
                status = peers.lmn_status(cluster, node)
                if (status.get("modelStatus") or {}).get(b_key) == DOWNLOADED:
                    pytest.fail(f"the refused tenant's entry is {DOWNLOADED} on {node}")
                entry = (status.get("modelProgress") or {}).get(b_key) or {}
                # it may follow its own scope's origin download on the other node (which gets
                # nothing, then fails): never a byte from a peer
                if entry.get("peerBytes"):
                    pytest.fail(f"the refused tenant took bytes from a peer on {node}: {entry}")
            for job in peers.download_jobs(cluster, tenant, scoped.key):
                if peers.is_peer_job(job):
                    name = job["metadata"]["name"]
                    peer_jobs[name] = peers.fetch_reports(cluster, tenant, name)
            cache = cluster.get(LMNC.plural, "bert", namespace=tenant) or {}
            node_status = (cache.get("status") or {}).get("nodeStatus") or {}
            return all(node_status.get(n) == "NodeDownloadError" for n in cluster.node_names)

        cluster.wait(
            refused_everywhere,
            timeout=240,
            what="the refused tenant's cache shows NodeDownloadError on both nodes",
        )

        def reports_the_store() -> bool:
            cache = cluster.get(LMNC.plural, "bert", namespace=tenant)
            degraded = cluster.condition(cache, "Degraded") or {}
            return jobfailures.GIST_S3_FORBIDDEN in str(degraded.get("message"))

        cluster.wait(
            reports_the_store,
            timeout=120,
            what=f"its cache's Degraded says {jobfailures.GIST_S3_FORBIDDEN!r}",
        )

        def origin_refusal_on_every_node() -> bool:
            # a node that followed its scope's origin download on the other node fell back
            # to the origin (`use origin`), whose refusal it then reports
            entries = {n: peers.progress(cluster, n, b_key) for n in cluster.node_names}
            return all(
                jobfailures.GIST_S3_FORBIDDEN in str(e.get("message"))
                and e.get("source") in (None, "origin")
                for e in entries.values()
            )

        cluster.wait(
            origin_refusal_on_every_node,
            timeout=120,
            what=f"every node's entry says {jobfailures.GIST_S3_FORBIDDEN!r} from the origin",
        )
        # The store answered its requests with refusals, and no object left it for it.
        assert peers.s3_gets(scoped.log, scoped.bucket) == before
        refused = [r for r in peers.s3_requests(scoped.log, scoped.bucket) if r[2] == 403]
        assert refused, "the store refused nothing"
        # A peer-mode attempt, if the planner made one, got no byte.
        for name, reports in peer_jobs.items():
            for report in reports:
                assert not report.get("peerBytes"), f"{name} got peer bytes: {report}"
        for node in cluster.node_names:
            models = cluster.models_root(node) / layout.MODELS_DIR
            variants = [p.name for p in models.iterdir() if p.name.startswith(f"{scoped.key}.")]
            assert not variants, f"a folder of the refused tenant on {node}: {variants}"
            assert cluster.model_files(node, scoped.key) == scoped.digests, node
    finally:
        cluster.kubectl(
            "delete", LMNC.plural, "bert", "-n", tenant, "--wait=true", "--timeout=90s", check=False
        )
        cluster.kubectl("delete", "namespace", tenant, "--wait=false", check=False)


def _borrowed_download_identity_is_refused(cluster: Cluster, scoped: Scoped, tenant: str) -> None:
    """The refused tenant mints a `localcache-peer` token bound to the pod of its own download
    Job of the model (a Job the agent made and records, of another scope) and asks the peers
    with it: refused (403 other scope; 401 once that pod is gone; 503 for its own download in
    progress, which has nothing), no byte."""
    user = cluster.tenant(tenant)

    def download_pod() -> Obj | None:
        for job in peers.download_jobs(cluster, tenant, scoped.key):
            pods = cluster.items(
                "pods", namespace=tenant, selector=f"job-name={job['metadata']['name']}"
            )
            if pods:
                found: Obj = pods[0]
                return found
        return None

    pod = cluster.wait(
        download_pod, timeout=120, what=f"a download pod of {scoped.key} in {tenant}"
    )
    meta = pod["metadata"]
    minted = cluster.kubectl(
        "create", "token", pod["spec"].get("serviceAccountName") or "default", "-n", tenant,
        f"--audience={peer_api.TOKEN_AUDIENCE}", "--bound-object-kind=Pod",
        f"--bound-object-name={meta['name']}", f"--bound-object-uid={meta['uid']}",
        "--duration=10m", f"--as={user}", check=False,
    )  # fmt: skip
    # the pod may be gone already (its Job failed and was replaced): then only the others
    assert minted.returncode == 0 or "not found" in minted.stderr, minted.stderr
    tokens = {"download-pod": minted.stdout.strip()} if minted.returncode == 0 else {}
    probe = peers.probe_pod(
        "peer-probe", tenant, node=cluster.node_names[0], ca=peers.peer_ca(cluster),
        targets=peers.targets(cluster, scoped.key, list(scoped.files)), tokens=tokens,
    )  # fmt: skip
    cluster.kubectl("create", "-f", "-", f"--as={user}", input_text=json.dumps(probe))
    rows = peers.probe_results(cluster, tenant, "peer-probe")
    # 503 "nothing-yet": while its own origin download runs, the node serves that download
    # to its scope, and it has no whole file (the store refuses it)
    extra = {"download-pod": {401, 403, 503}} if tokens else {}
    _refused(rows, digests=set(scoped.digests.values()), who="the refused tenant", extra=extra)


def _refused(
    rows: list[Obj], *, digests: set[str], who: str, extra: dict[str, set[int]] | None = None
) -> None:
    """Every request of `rows` refused with the status its token deserves (no token, a
    garbage one or one of another audience: 401; the pod's own `localcache-peer` token: 403;
    `extra`: by name), none with bytes of the model."""
    want = {"none": {401}, "garbage": {401}, "default-audience": {401}, "peer-audience": {403}}
    want.update(extra or {})
    tried = {r["token"] for r in rows}
    must = {"none", "garbage", "peer-audience", *(extra or {})}
    assert must <= tried <= set(want), f"{who}: tried {tried}"
    leaked = [r for r in rows if r.get("status") in (200, 206) or r.get("sha256") in digests]
    assert not leaked, f"{who} got bytes: {json.dumps(leaked)}"
    wrong = [r for r in rows if r.get("status") not in want[r["token"]]]
    # a 503 only as "nothing yet" (its own download has no file), never an outage let through
    wrong += [
        r
        for r in rows
        if r.get("status") == 503 and not str(r.get("text")).startswith("nothing-yet")
    ]
    assert not wrong, f"{who}: unexpected answers {json.dumps(wrong)}"


def test_callers_that_are_not_a_download_job_of_the_scope_are_refused(
    cluster: Cluster, scoped: Scoped
) -> None:
    _ready_and_served(cluster, scoped)
    ca = peers.peer_ca(cluster)
    targets = peers.targets(cluster, scoped.key, list(scoped.files))
    digests = set(scoped.digests.values())
    user = cluster.tenant(scoped.namespace)
    before = sum(
        peers.metric_total(peers.agent_metrics(cluster, n), "localcache_p2p_refusals_total")
        for n in cluster.node_names
    )

    # The tenant's own pod, with a projected token for the peer audience.
    pod = peers.probe_pod(
        "peer-probe", scoped.namespace, node=cluster.node_names[0], ca=ca, targets=targets
    )
    cluster.kubectl("create", "-f", "-", f"--as={user}", input_text=json.dumps(pod))
    rows = peers.probe_results(cluster, scoped.namespace, "peer-probe")
    _refused(rows, digests=digests, who="the tenant's pod")

    # A Job shaped like a download Job (name pattern, labels) on the other node.
    job = peers.forged_download_job(
        scoped.namespace,
        cache="bert",
        storage_key=scoped.key,
        node=cluster.node_names[-1],
        ca=ca,
        targets=targets,
    )
    name = job["metadata"]["name"]
    done = cluster.kubectl(
        "create", "-f", "-", f"--as={user}", input_text=json.dumps(job), check=False
    )
    if done.returncode != 0:  # admission refused the tenant; an admin-made forgery then
        assert "denied" in done.stderr or "forbidden" in done.stderr.lower(), done.stderr
        cluster.create(job)
    pod_name = cluster.wait(
        lambda: peers.job_pod(cluster, scoped.namespace, name),
        timeout=60,
        what=f"the forged Job {name} has a pod",
    )
    rows = peers.probe_results(cluster, scoped.namespace, pod_name)
    _refused(rows, digests=digests, who="the forged Job's pod")

    after = sum(
        peers.metric_total(peers.agent_metrics(cluster, n), "localcache_p2p_refusals_total")
        for n in cluster.node_names
    )
    assert after > before, f"no refusal counted by the agents ({before} -> {after})"


# ------------------------------------------------------------------- hostile and failures


FALLBACK_EVENT = "PeerFallback"
VERIFY_FAILURES = "localcache_p2p_verify_failures_total"
BAD_SOURCE_EVENT = "PeerSourceRejected"


def _is_fallback(event: Obj) -> bool:
    return event.get("reason") == FALLBACK_EVENT


def _names_bad_source(text: str, node: str) -> bool:
    """`text` names `node` as having served bytes that failed verification."""
    lowered = text.lower()
    return node in text and any(w in lowered for w in ("sha256", "verif", "corrupt", "mismatch"))


def _first_downloaded(cluster: Cluster, name: str) -> str | None:
    for node in cluster.node_names:
        if cluster.node_status(node).get(name) == DOWNLOADED:
            return node
    return None


class _Watch:
    """Polls `folder` until stopped: it must hold nothing or exactly `want`, never else."""

    def __init__(self, folder: Path, want: dict[str, str]) -> None:
        self.violations: list[dict[str, str]] = []
        self._stop = threading.Event()

        def watch() -> None:
            while not self._stop.wait(0.1):
                got = tree_digests(folder)
                if got and got != want:
                    self.violations.append(got)

        self._thread = threading.Thread(target=watch, name="promoted-watch")
        self._thread.start()

    def stop(self) -> list[dict[str, str]]:
        self._stop.set()
        self._thread.join()
        return self.violations


def test_a_flipped_byte_in_a_peers_copy_is_never_promoted_and_the_source_is_reported(
    cluster: Cluster, sources: Sources, labelled: str
) -> None:
    # One node first, so that it is the source (the seed election is not what this shows).
    origin, other = cluster.node_names[0], cluster.node_names[-1]
    peers.label_node(cluster, origin, labelled)
    run = uuid.uuid4().hex[:6]
    name, group = f"flip-{run}", f"g-flip-{run}"
    data = os.urandom(2 * MIB)
    sources.add_file(f"{name}/model.bin", data)
    uri = f"{sources.http_base}/{name}/model.bin"
    key = keys.storage_key(uri)
    want = {"model.bin": _sha(data)}
    cluster.apply(
        peers.peer_group(cluster, group, selector={GROUP_LABEL: labelled}),
        objects.cache(name, uri, group),
    )
    flipped: Path | None = None
    watch: _Watch | None = None
    try:
        cluster.wait_ready(LMC.plural, name, timeout=240)
        assert peers.progress(cluster, origin, name).get("source") == "origin"
        cluster.wait(
            lambda: peers.served(cluster, origin, key), timeout=120, what=f"{origin} serves {key}"
        )

        # One byte flipped in the serving node's copy; the size stays.
        flipped = cluster.models_root(origin) / layout.model_subpath(key) / "model.bin"
        with flipped.open("r+b") as f:
            f.seek(len(data) // 2)
            f.write(bytes([data[len(data) // 2] ^ 0x01]))

        # The other node joins the group and fetches the model.
        watch = _Watch(cluster.models_root(other) / layout.model_subpath(key), want)
        seen_peer_jobs: dict[str, list[Obj]] = {}
        peers.label_node(cluster, other, labelled)

        def downloaded_again() -> bool:
            for job in peers.peer_jobs_of(cluster, JOBS_NS, key, other):
                job_name = job["metadata"]["name"]
                seen_peer_jobs[job_name] = peers.fetch_reports(cluster, JOBS_NS, job_name)
            return cluster.node_status(other).get(name) == DOWNLOADED

        cluster.wait(downloaded_again, timeout=240, what=f"{other} has {name}")
        assert not watch.stop(), f"a corrupted copy was promoted on {other}"
        assert cluster.model_files(other, key) == want
        entry = peers.progress(cluster, other, name)
        # the bad peer banned, the same Job took the file whole from the origin (an http model)
        assert entry.get("source") == f"peer/{origin}", f"{other}'s copy came from {entry}"
        assert entry.get("originBytes") == len(data), f"{other}'s copy came from {entry}"
        assert seen_peer_jobs, f"{other} never tried the peer {origin}"

        def reported() -> str:
            fell_back = [e for e in peers.lmn_events(cluster, other) if _is_fallback(e)]
            assert fell_back, f"no {FALLBACK_EVENT} Event on {other}"
            rejected = [
                e
                for e in peers.lmn_events(cluster, other)
                if e.get("reason") == BAD_SOURCE_EVENT
                and _names_bad_source(str(e.get("message")), origin)
            ]
            assert rejected, (
                f"no {BAD_SOURCE_EVENT} Event on {other} naming {origin}: "
                f"{peers.describe_events(peers.lmn_events(cluster, other))}"
            )
            failures = peers.metric_total(peers.agent_metrics(cluster, other), VERIFY_FAILURES)
            assert failures >= 1, f"{VERIFY_FAILURES} of {other}'s agent is {failures}"
            return str(rejected[0].get("message"))

        cluster.wait(reported, timeout=60, what=f"{origin} reported as a source of bad bytes")
    finally:
        if watch is not None:
            watch.stop()
        if flipped is not None and flipped.exists():
            with flipped.open("r+b") as f:
                f.seek(len(data) // 2)
                f.write(data[len(data) // 2 : len(data) // 2 + 1])
        cluster.kubectl("delete", LMC.plural, name, "--wait=true", "--timeout=90s", check=False)
        cluster.kubectl("delete", "localmodelnodegroup", group, "--wait=false", check=False)


def test_the_serving_agent_killed_mid_transfer_leaves_every_node_a_verified_copy(
    cluster: Cluster, sources: Sources, labelled: str
) -> None:
    # One node first, so that it is the source (the seed election is not what this shows).
    origin, other = cluster.node_names[0], cluster.node_names[-1]
    peers.label_node(cluster, origin, labelled)
    run = uuid.uuid4().hex[:6]
    name, group = f"kill-{run}", f"g-kill-{run}"
    data = os.urandom(4 * MIB)
    sources.add_file(f"{name}/model.bin", data)
    uri = f"{sources.http_base}/{name}/model.bin"
    key = keys.storage_key(uri)
    want = {"model.bin": _sha(data)}
    started = time.monotonic()
    cluster.apply(
        # 256 KiB/s: the peer transfer takes 16 s, longer than the agent's stop grace (5 s)
        peers.peer_group(cluster, group, selector={GROUP_LABEL: labelled}, uploadBandwidth="256Ki"),
        objects.cache(name, uri, group),
    )
    try:
        cluster.wait_ready(LMC.plural, name, timeout=180)
        to_one = time.monotonic() - started
        cluster.wait(
            lambda: peers.served(cluster, origin, key), timeout=120, what=f"{origin} serves {key}"
        )
        started = time.monotonic()
        peers.label_node(cluster, other, labelled)
        root = cluster.models_root(other)

        def fetching() -> tuple[str, int] | None:
            for job in peers.peer_jobs_of(cluster, JOBS_NS, key, other):
                job_name = job["metadata"]["name"]
                staged = peers.staged_bytes(root, key, job_name)
                if 0 < staged < len(data):
                    return job_name, staged
            return None

        job_name, staged = cluster.wait(
            fetching, timeout=180, what=f"{other} fetching {name} from {origin}"
        )
        killed = peers.agent_pod(cluster, origin)["metadata"]["name"]
        # one second's grace: the kubelet kills the agent in the middle of its own stop grace
        cluster.kubectl(
            "delete", "pod", "-n", SYSTEM_NS, killed, "--grace-period=1", "--wait=false"
        )

        cluster.wait(
            lambda: peers.agent_replaced(cluster, origin, killed),
            timeout=120,
            what=f"a new agent is Ready on {origin}",
        )
        cluster.wait(
            lambda: cluster.node_status(other).get(name) == DOWNLOADED,
            timeout=240,
            what=f"{other} has {name}",
        )
        to_second = time.monotonic() - started
        for node in cluster.node_names:
            assert cluster.model_files(node, key) == want, f"{node}'s copy"
        entry = peers.progress(cluster, other, name)
        reports = peers.fetch_reports(cluster, JOBS_NS, job_name)
        detail = (
            f"staged {staged} B when {killed} was deleted; {other}: {entry}; reports {reports}; "
            f"{origin} alone {to_one:.1f}s, then {other} {to_second:.1f}s"
        )
        print(f"agent killed mid-transfer: {detail}")  # the times, for the closing note
        # the killed agent was the only peer: the same Job finished the file from the origin
        # by Range, so every byte crossed once and nothing restarted from byte 0
        assert entry.get("source") == f"peer/{origin}", detail
        assert entry.get("peerBytes", 0) > 0, detail
        assert entry.get("originBytes", 0) > 0, detail
        assert entry["peerBytes"] + entry["originBytes"] == len(data), detail
        resumed = [
            e for e in peers.lmn_events(cluster, other)
            if _is_fallback(e) and "resumed-at-origin" in e.get("message", "")
        ]  # fmt: skip
        assert resumed, f"no resumed-at-origin fallback Event on {other}: {detail}"
    finally:
        cluster.kubectl("delete", LMC.plural, name, "--wait=true", "--timeout=90s", check=False)
        cluster.kubectl("delete", "localmodelnodegroup", group, "--wait=false", check=False)
