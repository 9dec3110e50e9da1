"""Volumes that show a whole models root are replaced by localcache's CSI volumes without a
download (issue 20, "What to build" 1: claims adopted from KServe's add-on, or made with
`volumeSource: hostPath`), on real pods: never while a pod mounts the claim, and as soon as
none does; the pod that comes next reads the same bytes through the CSI view.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from typing import Any

import pytest

from localcache.caching import keys, names
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import SYSTEM_NS, Cluster, Sources
from tests.e2e.realnodes.objects import LMNC

Obj = dict[str, Any]
CONTROLLER = "app.kubernetes.io/component=controller"

pytestmark = pytest.mark.timeout(480)


def _serving_pod(name: str, namespace: str, *, claim: str, sub_path: str, node: str) -> Obj:
    """A model server's pod: it reads the model, prints its digests, and keeps running."""
    pod = objects.digest_pod(name, namespace, claim=claim, sub_path=sub_path, node=node)
    (container,) = pod["spec"]["containers"]
    container["command"][-1] += "import time\ntime.sleep(3600)\n"
    pod["spec"]["terminationGracePeriodSeconds"] = 1
    return pod


def _volume(cluster: Cluster, claim: str, namespace: str) -> Obj:
    pvc = cluster.get("pvc", claim, namespace=namespace) or {}
    pv = cluster.get("pv", str((pvc.get("spec") or {}).get("volumeName") or "")) or {}
    return pv


def test_a_hostpath_claim_is_replaced_by_a_csi_volume_once_no_pod_mounts_it(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    group = f"g-{run}"
    node = cluster.node_names[0]
    data = os.urandom(64 * 1024)
    sources.add_file(f"legacy-{run}/model.onnx", data)
    uri = f"{sources.http_base}/legacy-{run}/model.onnx"
    key = keys.storage_key(uri)
    tenant = cluster.namespace("legacy")
    claim = names.serving_pvc("model", group)
    sub_path = f"models/{key}"
    with cluster.local_model(volumeSource="hostPath"):
        cluster.apply(
            cluster.node_group(group, selector={"kubernetes.io/hostname": node}),
            objects.cache("model", uri, group, namespace=tenant),
        )
        cluster.create(objects.isvc("model", tenant, uri))
        cluster.wait_ready(LMNC.plural, "model", namespace=tenant, timeout=180)
        cluster.wait_bound(claim, namespace=tenant)
        old = _volume(cluster, claim, tenant)
        assert "csi" not in old["spec"], old["spec"]
        cluster.create(_serving_pod("server", tenant, claim=claim, sub_path=sub_path, node=node))

        def serving() -> str | None:
            pod = cluster.get("pod", "server", namespace=tenant) or {}
            return "yes" if (pod.get("status") or {}).get("phase") == "Running" else None

        cluster.wait(serving, timeout=120, what="the model server runs on the hostPath claim")
    folder = cluster.models_root(node) / "models" / key
    inode = folder.stat().st_ino
    jobs = {j["metadata"]["uid"] for j in cluster.items("jobs", namespace=tenant)}

    old_name = old["metadata"]["name"]

    def kept_for_the_pod() -> bool | None:
        logs = cluster.kubectl("logs", "-n", SYSTEM_NS, "-l", CONTROLLER, "--tail=-1").stdout
        return True if "volume_legacy_in_use" in logs and old_name in logs else None

    cluster.wait(
        kept_for_the_pod,
        timeout=120,
        what=f"the controller finds pod server mounting legacy PV {old_name} and waits",
    )
    assert _volume(cluster, claim, tenant)["metadata"]["uid"] == old["metadata"]["uid"]

    cluster.kubectl("delete", "pod", "server", "-n", tenant, "--wait=true", "--timeout=120s")

    def replaced() -> Obj | None:
        pv = _volume(cluster, claim, tenant)
        pvc = cluster.get("pvc", claim, namespace=tenant) or {}
        bound = (pvc.get("status") or {}).get("phase") == "Bound"
        return pv if bound and (pv.get("spec") or {}).get("csi") else None

    new = cluster.wait(
        replaced, timeout=180, what=f"claim {claim} bound again, to a CSI volume of localcache"
    )
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    cluster.create(objects.digest_pod("reader", tenant, claim=claim, sub_path=sub_path, node=node))

    def read() -> dict[str, str] | None:
        pod = cluster.get("pod", "reader", namespace=tenant) or {}
        phase = (pod.get("status") or {}).get("phase")
        assert phase != "Failed", "the reader failed on the CSI volume"
        if phase != "Succeeded":
            return None
        found: dict[str, str] = json.loads(cluster.kubectl("logs", "-n", tenant, "reader").stdout)
        return found

    seen = cluster.wait(read, timeout=180, what="a new pod reads the model through the CSI view")
    assert seen == {"model.onnx": hashlib.sha256(data).hexdigest()}
    assert folder.stat().st_ino == inode, "the model folder was replaced"
    now = {j["metadata"]["uid"] for j in cluster.items("jobs", namespace=tenant)}
    assert now == jobs, "a download Job was created for the replacement"
