"""Real download Jobs on real nodes, with KServe's own storage code (the storage initializer).

- A namespace cache of a private `s3://` model, with credentials from its ServiceAccount's
  Secret, becomes Ready on both nodes; the files on each node's disk are the source's.
- The same URI from another namespace without valid credentials never becomes downloaded: the
  store refuses, the cache says so in status and Events, and the first tenant's copy stays.
- A cluster cache of an `http://` model; a cache using `storage.key` with the
  `storage-config` Secret; a ClusterStorageContainer that takes precedence over the default
  download image.
"""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest

from localcache.agent.jobs import peerjob
from localcache.caching import keys
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import (
    JOBS_NS,
    LOCALCACHE_IMAGE,
    STORAGE_INITIALIZER_IMAGE,
    Cluster,
    Sources,
)
from tests.e2e.realnodes.objects import LMC, LMNC

pytestmark = pytest.mark.timeout(300)


def _digests(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


def _job_images(cluster: Cluster, namespace: str, storage_key: str) -> set[str]:
    """The images of the model's origin download Jobs (peer-mode Jobs, which fetch from
    other nodes with localcache's image, left out)."""
    selector = f"storageKey={storage_key},!{peerjob.PEER_LABEL}"
    jobs = cluster.items("jobs", namespace=namespace, selector=selector)
    assert jobs, f"no origin download Job for {storage_key} in {namespace}"
    return {c["image"] for job in jobs for c in job["spec"]["template"]["spec"]["containers"]}


def test_credentialed_namespace_cache_is_downloaded_by_kserve_storage_and_others_are_refused(
    cluster: Cluster, sources: Sources
) -> None:
    bucket = f"private-{uuid.uuid4().hex[:8]}"
    uri, files = sources.private_model(bucket)
    key = keys.storage_key(uri)
    group = f"g-{uuid.uuid4().hex[:6]}"
    cluster.apply(cluster.node_group(group))

    # Tenant A: the ServiceAccount's Secret holds keys the store accepts.
    tenant_a = cluster.namespace("tenant-a")
    store, endpoint = sources.require_s3()
    key_id, secret = store.create_user(f"tenant-a-{bucket}")
    cluster.apply(
        *objects.s3_credentials(
            tenant_a,
            name="s3-reader",
            endpoint=endpoint,
            key_id=key_id,
            secret=secret,
        ),
        objects.cache("bert", uri, group, namespace=tenant_a, service_account="s3-reader"),
    )
    cached = cluster.wait_ready(LMNC.plural, "bert", namespace=tenant_a, timeout=180)
    assert cached["status"]["copies"]["available"] == len(cluster.node_names)
    for node in cluster.node_names:
        assert cluster.model_files(node, key) == _digests(files), f"model on {node}"
    assert _job_images(cluster, tenant_a, key) == {STORAGE_INITIALIZER_IMAGE}

    # Tenant B: the same URI with keys the store does not know. The download is refused.
    tenant_b = cluster.namespace("tenant-b")
    cluster.apply(
        *objects.s3_credentials(
            tenant_b,
            name="s3-reader",
            endpoint=endpoint,
            key_id="AKIAUNKNOWNTENANTB00",
            secret="not-a-valid-secret",
        ),
        objects.cache("bert", uri, group, namespace=tenant_b, service_account="s3-reader"),
    )
    b_key = keys.status_key("bert", tenant_b)

    def refused_on_every_node() -> bool:
        obj = cluster.get(LMNC.plural, "bert", namespace=tenant_b) or {}
        node_status = (obj.get("status") or {}).get("nodeStatus") or {}
        for node in cluster.node_names:
            assert cluster.node_status(node).get(b_key) != "ModelDownloaded", (
                f"tenant B's entry reported downloaded on {node} without valid credentials"
            )
        return all(node_status.get(n) == "NodeDownloadError" for n in cluster.node_names)

    cluster.wait(
        refused_on_every_node,
        timeout=180,
        what="tenant B's cache shows NodeDownloadError on every node",
    )
    b_cache = cluster.get(LMNC.plural, "bert", namespace=tenant_b)
    ready = cluster.condition(b_cache, "Ready")
    assert ready is not None, b_cache
    assert ready["status"] != "True", b_cache
    events = cluster.items("events", namespace=tenant_b)
    warnings = [
        e
        for e in events
        if e.get("type") == "Warning"
        and e["involvedObject"].get("name") == "bert"
        and e["involvedObject"].get("kind") == LMNC.kind
    ]
    assert warnings, f"no Warning Event on tenant B's cache: {[e.get('reason') for e in events]}"
    progress = cluster.get("localmodelnodes", cluster.node_names[0]) or {}
    message = ((progress.get("status") or {}).get("modelProgress") or {}).get(b_key, {})
    assert message.get("message"), f"the failure is not explained: {message}"

    # Tenant A keeps its Ready cache and its files.
    a_cache = cluster.get(LMNC.plural, "bert", namespace=tenant_a)
    assert (cluster.condition(a_cache, "Ready") or {}).get("status") == "True"
    for node in cluster.node_names:
        assert cluster.model_files(node, key) == _digests(files), f"tenant A's copy on {node}"


def test_cluster_cache_of_an_http_model_is_downloaded_on_every_node(
    cluster: Cluster, sources: Sources
) -> None:
    name = f"iris-{uuid.uuid4().hex[:6]}"
    data = os.urandom(300 * 1024)
    sources.add_file(f"{name}/model.joblib", data)
    uri = f"{sources.http_base}/{name}/model.joblib"
    group = f"g-{uuid.uuid4().hex[:6]}"
    cluster.apply(cluster.node_group(group), objects.cache(name, uri, group))
    cluster.wait_ready(LMC.plural, name, timeout=180)
    key = keys.storage_key(uri)
    want = {"model.joblib": hashlib.sha256(data).hexdigest()}
    for node in cluster.node_names:
        assert cluster.model_files(node, key) == want, f"model on {node}"
    assert _job_images(cluster, JOBS_NS, key) == {STORAGE_INITIALIZER_IMAGE}
    cluster.kubectl("delete", LMC.plural, name, "--wait=true", "--timeout=90s")


def test_storage_key_gives_the_download_the_storage_config_entry(
    cluster: Cluster, sources: Sources
) -> None:
    bucket = f"spec-{uuid.uuid4().hex[:8]}"
    uri, files = sources.private_model(bucket)
    store, endpoint = sources.require_s3()
    key_id, secret = store.create_user(f"spec-{bucket}")
    namespace = cluster.namespace("storage-spec")
    group = f"g-{uuid.uuid4().hex[:6]}"
    entry = {
        "type": "s3",
        "access_key_id": key_id,
        "secret_access_key": secret,
        "endpoint_url": f"http://{endpoint}",
        "bucket": bucket,
        "region": "us-east-1",
    }
    cluster.apply(
        cluster.node_group(group),
        objects.storage_config(namespace, key="local-s3", entry=entry),
        objects.cache("bert", uri, group, namespace=namespace, storage_key="local-s3"),
    )
    cluster.wait_ready(LMNC.plural, "bert", namespace=namespace, timeout=180)
    for node in cluster.node_names:
        assert cluster.model_files(node, keys.storage_key(uri)) == _digests(files), node


def test_a_cluster_storage_container_takes_precedence_over_the_storage_initializer(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    prefix = f"{sources.http_base}/csc-{run}/"
    data = os.urandom(64 * 1024)
    sources.add_file(f"csc-{run}/weights.bin", data)
    uri = prefix + "weights.bin"
    group = f"g-{run}"
    csc = objects.localcache_downloader(f"e2e-{run}", prefix)
    cluster.apply(csc, cluster.node_group(group), objects.cache(f"csc-{run}", uri, group))
    try:
        cluster.wait_ready(LMC.plural, f"csc-{run}", timeout=180)
        key = keys.storage_key(uri)
        assert _job_images(cluster, JOBS_NS, key) == {LOCALCACHE_IMAGE}
        for node in cluster.node_names:
            assert cluster.model_files(node, key) == {
                "weights.bin": hashlib.sha256(data).hexdigest()
            }
    finally:
        cluster.kubectl("delete", LMC.plural, f"csc-{run}", "--wait=true", "--timeout=90s")
        cluster.kubectl("delete", "clusterstoragecontainer", f"e2e-{run}")
