"""A file broken off by its peer source is resumed by Range from the next *peer* (issue 23,
"resumes a broken file by Range from the next source"), on real nodes.

The bed's two nodes can show a resume from the origin only (test_peer_distribution: the
killed agent was the only peer). Here a third node joins the bed for the test
(`SharedBed.join_node`): the first node downloads the model from the origin, the second
from the first, and the third from one of them; that source's agent is killed while the
third node's Job is in the middle of the file. The same Job finishes the file from the other
peer by `Range`: each source gave part of it and the parts add up to the file exactly (a
restart from byte 0 would count the first part twice), the origin sent the model once in
all, and every node holds the model's bytes.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterator

import pytest

from localcache.api import peer as peer_api
from localcache.caching import keys
from tests.e2e.realnodes import objects, peers
from tests.e2e.realnodes.cluster import GROUP_LABEL, JOBS_NS, SYSTEM_NS, Cluster, Sources
from tests.e2e.realnodes.objects import LMC

pytestmark = pytest.mark.timeout(600)
MIB = 1024 * 1024
DOWNLOADED = "ModelDownloaded"


@pytest.fixture
def third_node(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[str]:
    """A third worker node on the shared bed for this test only; it leaves afterwards."""
    if os.environ.get("LOCALCACHE_E2E_KUBECONFIG"):
        pytest.skip("a node joins only the real-node test bed")
    shared = request.getfixturevalue("shared_bed")
    name: str = shared.join_node()
    try:
        yield name
    finally:
        shared.leave_node(name)


def _downloaded_and_served(cluster: Cluster, node: str, name: str, key: str) -> None:
    def done() -> bool:
        return cluster.node_status(node).get(name) == DOWNLOADED and bool(
            peers.served(cluster, node, key)
        )

    cluster.wait(
        done,
        timeout=240,
        what=f"{node} has {name} and serves it",
    )


def test_a_file_its_peer_broke_off_is_resumed_by_range_from_the_next_peer(
    cluster: Cluster, sources: Sources, third_node: str
) -> None:
    first, second = cluster.node_names[0], cluster.node_names[-1]
    run = uuid.uuid4().hex[:6]
    labelled, name, group = run, f"resume-{run}", f"g-resume-{run}"
    data = os.urandom(4 * MIB)
    sources.add_file(f"{name}/model.bin", data)
    uri = f"{sources.http_base}/{name}/model.bin"
    key = keys.storage_key(uri)
    want = {"model.bin": hashlib.sha256(data).hexdigest()}
    peers.label_node(cluster, first, labelled)
    cluster.apply(
        # 256 KiB/s per serving node: a 4 MiB transfer takes 16 s, longer than a kill takes
        peers.peer_group(cluster, group, selector={GROUP_LABEL: labelled}, uploadBandwidth="256Ki"),
        objects.cache(name, uri, group),
    )
    try:
        _downloaded_and_served(cluster, first, name, key)
        peers.label_node(cluster, second, labelled)
        _downloaded_and_served(cluster, second, name, key)
        started = time.monotonic()
        peers.label_node(cluster, third_node, labelled)
        root = cluster.models_root(third_node)

        def fetching() -> tuple[str, int, str] | None:
            source = peers.progress(cluster, third_node, name).get("source") or ""
            for job in peers.peer_jobs_of(cluster, JOBS_NS, key, third_node):
                job_name = job["metadata"]["name"]
                staged = peers.staged_bytes(root, key, job_name)
                if source.startswith("peer/") and 0 < staged < len(data) // 2:
                    return job_name, staged, source.removeprefix("peer/")
            return None

        job_name, staged, broken = cluster.wait(
            fetching, timeout=240, what=f"{third_node} in the first half of {name} from a peer"
        )
        assert broken in (first, second), f"{third_node} fetches from {broken}"
        (following,) = {first, second} - {broken}
        killed = peers.agent_pod(cluster, broken)["metadata"]["name"]
        cluster.kubectl(
            "delete", "pod", "-n", SYSTEM_NS, killed, "--grace-period=1", "--wait=false"
        )
        cluster.wait(
            lambda: cluster.node_status(third_node).get(name) == DOWNLOADED,
            timeout=240,
            what=f"{third_node} has {name}",
        )
        took = time.monotonic() - started

        # the cache's finalizer, and the package's next tests, need that node's agent
        cluster.wait(
            lambda: peers.agent_replaced(cluster, broken, killed),
            timeout=120,
            what=f"a new agent is Ready on {broken}",
        )
        for node in (first, second, third_node):
            assert cluster.model_files(node, key) == want, f"{node}'s copy"
        entry = peers.progress(cluster, third_node, name)
        reports = [
            peer_api.FetchReport.model_validate(r)
            for r in peers.fetch_reports(cluster, JOBS_NS, job_name)
            if "outcome" in r
        ]
        detail = (
            f"staged {staged} B from {broken} when {killed} was deleted; {third_node}: {entry}; "
            f"reports {reports}; {third_node} ready after {took:.1f}s"
        )
        print(f"resumed from the next peer: {detail}")  # for the closing note
        assert [r.outcome for r in reports] == ["complete"], detail
        (report,) = reports
        assert report.origin_bytes == 0, detail
        assert report.sources.get(broken, 0) >= staged, detail
        assert report.sources.get(following, 0) > 0, detail
        # the parts add up to the file exactly: the rest came by Range, nothing twice
        assert sum(report.sources.values()) == len(data), detail
        assert entry.get("peerBytes") == len(data), detail
        assert not entry.get("originBytes"), detail
        served_by_origin = sources.http_stats().bytes_sent if sources.http_stats else None
        if served_by_origin is not None:
            assert served_by_origin.get(f"/{name}/model.bin") == len(data), served_by_origin
    finally:
        cluster.kubectl("delete", LMC.plural, name, "--wait=true", "--timeout=90s", check=False)
        cluster.kubectl("delete", "localmodelnodegroup", group, "--wait=false", check=False)
        for node in (first, second, third_node):
            cluster.kubectl("label", "node", node, f"{GROUP_LABEL}-", check=False)
