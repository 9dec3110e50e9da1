"""Shared-volume namespace caches (`spec.pvcRef`, issue 22) on real nodes and a real RWX volume.

The volume is the test bed's shared export (`tests.support.sharedvolume` says why it is not
NFS), bound to a tenant's ReadWriteMany claim; first the bed itself is shown to share it: bytes
written through the claim on one node are read through it on the other.

Then, as a tenant following KServe's shared-PVC sample would (a user with the namespace's
`edit` role; only the PersistentVolume is the administrator's): a LocalModelNamespaceCache with
`pvcRef` of a private `s3://` model, credentials from the tenant's ServiceAccount, becomes
Ready (`ImportSucceeded`) through exactly one import Job, `<cache>-import` (its uid, the
claim's and the placed size recorded in `status.sharedVolume`); a pod on each node
mounts the claim read-only at `models/<storage key>` and both read the source's files; an
InferenceService created before Ready keeps its storageUri (with a warning naming the cache),
one created after is routed to `pvc://<claim>/models/<storage key>` with no node-local label;
deleting the cache leaves the claim and the model. While a slow import runs, the bytes so far
are in `status.sharedVolume.bytes`.
"""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest

from localcache.api import inferenceservice as isvc_api
from localcache.caching import keys
from tests.e2e.realnodes import objects, sharedclaim
from tests.e2e.realnodes.cluster import Cluster, Obj, Sources, tree_digests
from tests.e2e.realnodes.objects import ISVC, LMNC

pytestmark = pytest.mark.timeout(420)

CLAIM = "models-rwx"
CACHE = "bert"
SHARED_CACHE_ANNOTATION = "localcache.kserve.io/shared-volume-cache"
IMPORT_TIMEOUT_S = 240.0


def test_the_bed_volume_is_read_write_many_across_both_nodes(cluster: Cluster) -> None:
    namespace = cluster.namespace("rwx")
    folder = sharedclaim.create(cluster, namespace, CLAIM)
    pvc = cluster.get("pvc", CLAIM, namespace=namespace) or {}
    assert (pvc.get("status") or {}).get("accessModes") == ["ReadWriteMany"], pvc.get("status")
    sharedclaim.prove_shared(cluster, namespace, claim=CLAIM, folder=folder)


def test_a_pvc_ref_cache_is_imported_once_read_on_both_nodes_and_routes_after_ready(
    cluster: Cluster, sources: Sources
) -> None:
    bucket = f"shared-{uuid.uuid4().hex[:8]}"
    uri, files = sources.private_model(bucket)
    key = keys.storage_key(uri)
    want = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    namespace = cluster.namespace("shared-cache")
    user = cluster.tenant(namespace)  # the tenant does all but the PersistentVolume
    store, endpoint = sources.require_s3()
    key_id, secret = store.create_user(f"shared-{bucket}")
    for obj in objects.s3_credentials(
        namespace, name="s3-reader", endpoint=endpoint, key_id=key_id, secret=secret
    ):
        sharedclaim.create_as(cluster, obj, user)
    sharedclaim.create_as(cluster, _shared_cache(namespace, uri), user)

    # Before Ready (held there: the claim does not exist yet, so the cache is PVCNotFound), the
    # webhook admits the InferenceService unchanged and says why.
    cluster.wait(
        lambda: _ready_reason(cluster, namespace) == "PVCNotFound",
        timeout=60,
        what=f"cache {CACHE} reports Ready=False, PVCNotFound, before its claim exists",
    )
    warned = sharedclaim.create_as(cluster, objects.isvc("before", namespace, uri), user)
    warnings = [ln for ln in warned.splitlines() if ln.startswith("Warning:")]
    assert any(f"{namespace}/{CACHE}" in ln for ln in warnings), (
        f"no warning naming the cache: {warned}"
    )
    assert _storage_uri(cluster, namespace, "before") == uri
    folder = sharedclaim.create(cluster, namespace, CLAIM, user=user)

    cached = cluster.wait_ready(LMNC.plural, CACHE, namespace=namespace, timeout=IMPORT_TIMEOUT_S)
    ready = cluster.condition(cached, "Ready") or {}
    assert ready.get("reason") == "ImportSucceeded", ready
    copies = cached["status"].get("copies") or {}
    assert (copies.get("total"), copies.get("available")) == (1, 1), copies
    assert not cached["status"].get("nodeStatus"), cached["status"]
    job = _one_import_job(cluster, namespace, cached)
    # localcache's record: the Job trusted by its uid, the claim by its uid, the placed size
    shared = cached["status"].get("sharedVolume") or {}
    assert (shared.get("job") or {}).get("uid") == job["metadata"]["uid"], shared
    pvc = cluster.get("pvc", CLAIM, namespace=namespace) or {}
    assert shared.get("claimUID") == pvc["metadata"]["uid"], shared
    assert shared.get("bytes") == sum(len(data) for data in files.values()), shared

    # Both nodes read the same files through the claim; they are on the export itself.
    sub_path = f"models/{key}"
    for node in cluster.node_names:
        got = sharedclaim.read_digests(
            cluster, namespace, claim=CLAIM, sub_path=sub_path, node=node, user=user
        )
        assert got == want, f"{node} read {got} through the claim"
    assert tree_digests(folder / "models" / key) == want

    # After Ready: routed to the claim; the one before keeps its URI.
    sharedclaim.create_as(cluster, objects.isvc("after", namespace, uri), user)
    after = cluster.get(ISVC.plural, "after", namespace=namespace) or {}
    meta = after.get("metadata") or {}
    assert _predictor_uri(after) == f"pvc://{CLAIM}/models/{key}", after.get("spec")
    assert isvc_api.LOCAL_MODEL_LABEL not in (meta.get("labels") or {}), meta
    assert (meta.get("annotations") or {}).get(SHARED_CACHE_ANNOTATION) == CACHE, meta
    assert _storage_uri(cluster, namespace, "before") == uri

    # The tenant deletes the cache: its import Job goes, the claim and the model on it stay.
    claim_uid = pvc["metadata"]["uid"]
    cluster.kubectl(f"--as={user}", "delete", LMNC.plural, CACHE, "-n", namespace, "--wait=false")
    cluster.wait(
        lambda: (
            cluster.get(LMNC.plural, CACHE, namespace=namespace) is None
            and not cluster.items("jobs", namespace=namespace)
        ),
        timeout=120,
        what=f"cache {CACHE} and its import Job deleted",
    )
    kept = cluster.get("pvc", CLAIM, namespace=namespace) or {}
    assert (kept.get("metadata") or {}).get("uid") == claim_uid, kept
    assert tree_digests(folder / "models" / key) == want


def _shared_cache(namespace: str, uri: str) -> Obj:
    return {
        "apiVersion": LMNC.api_version,
        "kind": LMNC.kind,
        "metadata": {"name": CACHE, "namespace": namespace},
        "spec": {
            "sourceModelUri": uri,
            "modelSize": "64Mi",
            "pvcRef": CLAIM,
            "serviceAccountName": "s3-reader",
        },
    }


def _ready_reason(cluster: Cluster, namespace: str) -> str | None:
    """'True' once Ready, else the Ready condition's reason; None before it has one."""
    cond = cluster.condition(cluster.get(LMNC.plural, CACHE, namespace=namespace), "Ready")
    if cond is None:
        return None
    return "True" if cond.get("status") == "True" else str(cond.get("reason"))


def _predictor_uri(isvc: Obj) -> str | None:
    model = ((isvc.get("spec") or {}).get("predictor") or {}).get("model") or {}
    found = model.get("storageUri")
    return str(found) if found is not None else None


def _storage_uri(cluster: Cluster, namespace: str, name: str) -> str | None:
    return _predictor_uri(cluster.get(ISVC.plural, name, namespace=namespace) or {})


def _one_import_job(cluster: Cluster, namespace: str, cached: Obj) -> Obj:
    """The namespace's only Job, `<cache>-import`, controlled by the cache, pinned to no
    node, succeeded."""
    jobs = cluster.items("jobs", namespace=namespace)
    assert [j["metadata"]["name"] for j in jobs] == [f"{CACHE}-import"], jobs
    job = jobs[0]
    owners = [r for r in job["metadata"].get("ownerReferences") or [] if r.get("controller")]
    assert [r["uid"] for r in owners] == [cached["metadata"]["uid"]], owners
    assert (job.get("status") or {}).get("succeeded") == 1, job.get("status")
    assert "nodeSelector" not in job["spec"]["template"]["spec"], job["spec"]["template"]
    found: Obj = job
    return found


PROGRESS_SIZE = 40 * 1024 * 1024  # about 20 s from the throttled server (2 MiB/s)


def test_the_bytes_imported_so_far_are_in_the_status_while_the_import_runs(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:8]
    data = os.urandom(PROGRESS_SIZE)
    sources.add_file(f"shared-{run}/model.bin", data)
    uri = f"{sources.slow_base}/shared-{run}/model.bin"
    namespace = cluster.namespace("shared-progress")
    user = cluster.tenant(namespace)
    sharedclaim.create(cluster, namespace, CLAIM, user=user)
    cache = _shared_cache(namespace, uri)
    cache["spec"].pop("serviceAccountName")
    sharedclaim.create_as(cluster, cache, user)

    def progress() -> tuple[str, int] | None:
        """("seen", bytes) once bytes between 0 and the size show while importing; ("ready",
        0) if the import finished first (then the test fails, saying so)."""
        found = cluster.get(LMNC.plural, CACHE, namespace=namespace) or {}
        reason = _ready_reason(cluster, namespace)
        if reason == "True":
            return ("ready", 0)
        done = ((found.get("status") or {}).get("sharedVolume") or {}).get("bytes")
        if reason == "ImportRunning" and isinstance(done, int) and 0 < done < len(data):
            return ("seen", done)
        return None

    how, seen = cluster.wait(
        progress,
        timeout=IMPORT_TIMEOUT_S,
        what="the import running or done",
    )
    assert how == "seen", (
        f"the import finished without status.sharedVolume.bytes ever between 0 and {len(data)}"
    )
    cached = cluster.wait_ready(LMNC.plural, CACHE, namespace=namespace, timeout=IMPORT_TIMEOUT_S)
    final = (cached["status"].get("sharedVolume") or {}).get("bytes")
    assert final == len(data), (seen, final)
