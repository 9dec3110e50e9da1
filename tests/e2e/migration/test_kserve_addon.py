"""KServe v0.20.0's own add-on, built locally, does its job on real nodes: the state a
migration to localcache starts from is what KServe's users have."""

from __future__ import annotations

import pytest

from tests.e2e.migration.addon import ISVC_NAME, KServeAddon

pytestmark = pytest.mark.timeout(1200)  # the package's set-up: a test bed, KServe, downloads


def test_kserve_addon_downloaded_three_caches_on_two_nodes_and_a_pod_serves_one(
    kserve_addon: KServeAddon,
) -> None:
    addon = kserve_addon
    assert len(addon.node_names) == 2
    kinds = sorted(cache.kind for cache in addon.caches)
    assert kinds == ["LocalModelCache", "LocalModelCache", "LocalModelNamespaceCache"]
    assert len({cache.storage_key for cache in addon.caches}) == 3

    requests = addon.request_counts()
    for cache in addon.caches:
        assert requests.get(cache.path) == 2, f"{cache.path} not fetched once per node: {requests}"
        for node in addon.node_names:
            assert addon.disk_files(node, cache) == cache.files, (node, cache.name)
            folder = addon.node_models_dirs[node] / "models" / cache.storage_key
            assert folder.is_dir(), folder
        for node in addon.node_names:
            lmn = addon.cluster.get("localmodelnodes", node) or {}
            status = (lmn.get("status") or {}).get("modelStatus") or {}
            assert status.get(cache.status_key) == "ModelDownloaded", (node, status)

    claim = addon.cluster.get("pvc", addon.serving_claim, namespace=addon.serving_namespace)
    assert claim is not None
    assert claim["status"]["phase"] == "Bound", claim
    assert addon.serving_node in addon.node_names
    served = addon.cluster.get("localmodelcaches", addon.serving_cache.name) or {}
    isvc = {"name": ISVC_NAME, "namespace": addon.serving_namespace}
    assert served["status"]["inferenceServices"] == [isvc], served["status"]
    counts = addon.download_counts()
    assert counts.jobs == 6, counts  # one per cache and node, kept for KServe's TTL (1 h)
    read = addon.wait_fresh_read()
    assert read["files"] == addon.serving_cache.files
