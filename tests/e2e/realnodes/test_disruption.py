"""Failures on real nodes: an agent killed mid-download, a node leaving its group, and the
leading controller replica deleted while caches reconcile."""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcache.caching import keys
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import (
    CONTROLLER,
    GROUP_LABEL,
    SYSTEM_NS,
    Cluster,
    Sources,
    tree_digests,
)
from tests.e2e.realnodes.objects import LMC

pytestmark = pytest.mark.timeout(300)
LEASE = "localcache-controller"


@pytest.fixture
def labelled(cluster: Cluster) -> Iterator[str]:
    """A fresh value of the e2e group label, removed from every node afterwards."""
    value = uuid.uuid4().hex[:8]
    yield value
    for node in cluster.node_names:
        cluster.kubectl("label", "node", node, f"{GROUP_LABEL}-", check=False)


def _label(cluster: Cluster, node: str, value: str) -> None:
    cluster.kubectl("label", "node", node, f"{GROUP_LABEL}={value}", "--overwrite")


def _copies(root: Path, digests: dict[str, str]) -> list[Path]:
    """Every folder under a models root that holds a complete copy (models, staging, trash)."""
    found = []
    for folder in {p.parent for p in root.rglob("*") if p.is_file()}:
        if tree_digests(folder) == digests:
            found.append(folder)
    return found


def test_an_agent_killed_mid_download_leaves_one_complete_copy_and_never_a_partial_one(
    cluster: Cluster, sources: Sources, labelled: str
) -> None:
    node = cluster.node_names[0]
    _label(cluster, node, labelled)
    run = uuid.uuid4().hex[:6]
    data = os.urandom(12 * 1024 * 1024)  # six seconds at the slow server's rate
    root = cluster.models_root(node)
    sources.add_file(f"big-{run}/model.bin", data)
    uri = f"{sources.slow_base}/big-{run}/model.bin"
    key = keys.storage_key(uri)
    want = {"model.bin": hashlib.sha256(data).hexdigest()}
    group = f"g-{run}"
    name = f"big-{run}"

    # Watch for the whole test: whenever the node reports the model downloaded, the folder on
    # disk must be the complete model.
    stop = threading.Event()
    violations: list[str] = []

    def watch() -> None:
        while not stop.wait(0.2):
            try:
                if cluster.node_status(node).get(name) == "ModelDownloaded":
                    got = tree_digests(root / "models" / key)
                    if got != want:
                        violations.append(f"reported downloaded with {got}")
            except AssertionError:
                continue

    watcher = threading.Thread(target=watch, name="downloaded-watch")
    watcher.start()
    try:
        cluster.apply(
            cluster.node_group(group, selector={GROUP_LABEL: labelled}),
            objects.cache(name, uri, group),
        )

        def downloading() -> bool:
            staging = root / ".staging"
            return staging.is_dir() and any(
                p.stat().st_size > 0 for p in staging.rglob("model.bin*") if p.is_file()
            )

        cluster.wait(downloading, timeout=120, what=f"the download of {name} started on {node}")
        agent = _agent_pod(cluster, node)
        assert agent, f"no agent pod on {node}"
        cluster.kubectl("delete", "pod", "-n", SYSTEM_NS, agent, "--wait=false")
        cluster.wait(
            lambda: _agent_pod(cluster, node, ready=True) not in (None, agent),
            timeout=120,
            what=f"a new agent pod is Ready on {node}",
        )
        cluster.wait_ready(LMC.plural, name, timeout=180)
        cluster.wait(
            lambda: len(_copies(root, want)) == 1,
            timeout=60,
            what=f"exactly one complete copy of {name} on {node}",
        )
        assert tree_digests(root / "models" / key) == want
    finally:
        stop.set()
        watcher.join()
        cluster.kubectl("delete", LMC.plural, name, "--wait=false", check=False)
    assert not violations, violations


def _agent_pod(cluster: Cluster, node: str, *, ready: bool = False) -> str | None:
    for pod in cluster.items(
        "pods", namespace=SYSTEM_NS, selector="app.kubernetes.io/component=agent"
    ):
        if pod["spec"].get("nodeName") != node or pod["metadata"].get("deletionTimestamp"):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        is_ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        if is_ready or not ready:
            name: str = pod["metadata"]["name"]
            return name
    return None


def test_a_node_that_leaves_the_group_loses_its_model_folders(
    cluster: Cluster, sources: Sources, labelled: str
) -> None:
    for node in cluster.node_names:
        _label(cluster, node, labelled)
    run = uuid.uuid4().hex[:6]
    data = os.urandom(100 * 1024)
    sources.add_file(f"leave-{run}/model.bin", data)
    uri = f"{sources.http_base}/leave-{run}/model.bin"
    key = keys.storage_key(uri)
    name, group = f"leave-{run}", f"g-{run}"
    cluster.apply(
        cluster.node_group(group, selector={GROUP_LABEL: labelled}),
        objects.cache(name, uri, group),
    )
    cluster.wait_ready(LMC.plural, name, timeout=180)
    staying, leaving = cluster.node_names[0], cluster.node_names[-1]
    want = {"model.bin": hashlib.sha256(data).hexdigest()}
    assert cluster.model_files(leaving, key) == want

    cluster.kubectl("label", "node", leaving, f"{GROUP_LABEL}-")
    cluster.wait(
        lambda: cluster.model_files(leaving, key) == {},
        timeout=120,
        what=f"the model folder {key} removed from {leaving}'s disk",
    )
    assert cluster.model_files(staying, key) == want
    cluster.kubectl("delete", LMC.plural, name, "--wait=false")


def test_the_other_controller_replica_takes_over_when_the_leader_pod_is_deleted(
    cluster: Cluster, sources: Sources, labelled: str
) -> None:
    node = cluster.node_names[0]
    _label(cluster, node, labelled)
    run = uuid.uuid4().hex[:6]
    prefix = f"{sources.http_base}/many-{run}/"
    names = [f"many-{run}-{i:02d}" for i in range(20)]
    for name in names:
        sources.add_file(f"many-{run}/{name}.bin", os.urandom(4096))
    group = f"g-{run}"
    csc = objects.localcache_downloader(f"many-{run}", prefix)
    caches = [objects.cache(n, f"{prefix}{n}.bin", group) for n in names]
    leader = _leader(cluster)
    cluster.apply(csc, cluster.node_group(group, selector={GROUP_LABEL: labelled}), *caches)
    try:
        cluster.kubectl("delete", "pod", "-n", SYSTEM_NS, leader, "--wait=false")
        cluster.wait(
            lambda: _leader(cluster) not in ("", leader),
            timeout=90,
            what=f"another controller replica holds the lease after {leader} was deleted",
        )

        def all_ready() -> bool:
            listed = cluster.items(LMC.plural, selector="")
            ready = {
                c["metadata"]["name"]
                for c in listed
                if (cluster.condition(c, "Ready") or {}).get("status") == "True"
            }
            return set(names) <= ready

        cluster.wait(all_ready, timeout=240, what="all 20 caches Ready after the takeover")
        cluster.kubectl(
            "-n",
            SYSTEM_NS,
            "rollout",
            "status",
            f"deployment/{CONTROLLER}",
            "--timeout=120s",
            timeout=150,
        )
    finally:
        cluster.kubectl("delete", LMC.plural, *names, "--wait=false", check=False)
        cluster.kubectl("delete", "clusterstoragecontainer", f"many-{run}", check=False)


def _leader(cluster: Cluster) -> str:
    lease = cluster.get("lease", LEASE, namespace=SYSTEM_NS) or {}
    holder: str = (lease.get("spec") or {}).get("holderIdentity") or ""
    return holder.split("_")[0]
