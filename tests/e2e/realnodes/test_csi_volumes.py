"""Volumes that enforce entitlement when the kubelet mounts them (issue 20, findings 1 and 2),
as the attacker: a tenant with ordinary rights in its own namespace, real pods, the real
kubelet calling localcache's CSI node plugin.

- A tenant pod created *before* its claim exists, mounting it at the root and read-write (the
  admission policy sees no localcache volume then and admits it), starts once its cache is
  downloaded and sees only its own cache's folder, read-only: not the other tenant's folder,
  not the admin's cluster model, and no write reaches the node's disk.
- A tenant that caches another tenant's private URI without credentials and mounts its
  serving claim the way KServe does never starts: the kubelet's mount fails with localcache's
  message naming the cache, in the pod's Events.
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
from tests.e2e.realnodes.cluster import Cluster, Sources
from tests.e2e.realnodes.objects import LMC, LMNC

Obj = dict[str, Any]

pytestmark = pytest.mark.timeout(420)

_PROBE = r"""
import errno, json, os
root = '/mnt/models'
tree = []
for d, dirs, files in os.walk(root):
    rel = os.path.relpath(d, root)
    tree += [os.path.normpath(os.path.join(rel, n)) for n in dirs + files]
def attempt(path):
    try:
        with open(path, 'a') as f:
            f.write('owned\n')
        return 'written'
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
writes = {'root': attempt(os.path.join(root, 'planted'))}
for d, _, files in os.walk(root):
    for f in files:
        writes[os.path.relpath(os.path.join(d, f), root)] = attempt(os.path.join(d, f))
print(json.dumps({'tree': sorted(tree), 'writes': writes}, sort_keys=True))
"""


def _root_pod(name: str, namespace: str, *, claim: str, node: str, user: int) -> Obj:
    """The attack of finding 1: the claim at the root, no subPath, read-write."""
    pod = objects.digest_pod(name, namespace, claim=claim, sub_path="", node=node)
    pod["spec"]["securityContext"] = {"runAsUser": user, "runAsNonRoot": user != 0}
    (container,) = pod["spec"]["containers"]
    container["command"] = ["python3", "-c", _PROBE]
    container["volumeMounts"] = [{"name": "model", "mountPath": "/mnt/models", "readOnly": False}]
    return pod


def _phase(cluster: Cluster, name: str, namespace: str) -> str | None:
    pod = cluster.get("pod", name, namespace=namespace) or {}
    return (pod.get("status") or {}).get("phase")


def test_a_pod_created_before_its_claim_sees_only_its_own_cache_read_only(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    group = f"g-{run}"
    node = cluster.node_names[0]
    payload = {}
    for what in ("admin", "victim", "mine"):
        payload[what] = os.urandom(16 * 1024)
        sources.add_file(f"csi-{run}/{what}/model.onnx", payload[what])
    uri = {w: f"{sources.http_base}/csi-{run}/{w}/model.onnx" for w in payload}
    victim = cluster.namespace("victim")
    attacker = cluster.namespace("attacker")
    cluster.apply(
        cluster.node_group(group),
        objects.cache(f"admin-{run}", uri["admin"], group),
        objects.cache("weights", uri["victim"], group, namespace=victim),
    )
    cluster.wait_ready(LMC.plural, f"admin-{run}", timeout=180)
    cluster.wait_ready(LMNC.plural, "weights", namespace=victim, timeout=180)

    claim = names.serving_pvc("mine", group)
    assert cluster.get("pvc", claim, namespace=attacker) is None
    for pod, user in (("as-root", 0), ("as-user", 65532)):
        cluster.create(_root_pod(pod, attacker, claim=claim, node=node, user=user))
    cluster.apply(objects.cache("mine", uri["mine"], group, namespace=attacker))
    cluster.create(objects.isvc("mine", attacker, uri["mine"]))
    cluster.wait_ready(LMNC.plural, "mine", namespace=attacker, timeout=180)

    own = keys.storage_key(uri["mine"])
    for pod in ("as-root", "as-user"):

        def finished(pod: str = pod) -> str | None:
            phase = _phase(cluster, pod, attacker)
            return phase if phase in ("Succeeded", "Failed") else None

        cluster.wait(finished, timeout=240, what=f"the attacker's pod {pod} runs to its end")
        seen = json.loads(cluster.kubectl("logs", "-n", attacker, pod).stdout)
        assert seen["tree"] == ["models", f"models/{own}", f"models/{own}/model.onnx"], (
            f"{pod} saw more than its own cache's folder: {seen['tree']}"
        )
        assert seen["writes"] == {"root": "EROFS", f"models/{own}/model.onnx": "EROFS"}, seen
    for what in ("admin", "victim", "mine"):
        files = cluster.model_files(node, keys.storage_key(uri[what]))
        assert list(files.values()) == [hashlib.sha256(payload[what]).hexdigest()], (
            f"{what}'s model changed"
        )


def test_a_tenant_without_proof_of_access_mounts_nothing_and_its_pod_says_why(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    uri, _ = sources.private_model(f"csi-{run}")
    store, endpoint = sources.require_s3()
    node = cluster.node_names[0]
    group = f"g-{run}"
    owner = cluster.namespace("owner")
    key_id, secret = store.create_user(f"owner-{run}")
    cluster.apply(
        cluster.node_group(group),
        *objects.s3_credentials(
            owner, name="s3-reader", endpoint=endpoint, key_id=key_id, secret=secret
        ),
        objects.cache("bert", uri, group, namespace=owner, service_account="s3-reader"),
    )
    cluster.wait_ready(LMNC.plural, "bert", namespace=owner, timeout=180)

    intruder = cluster.namespace("intruder")
    cluster.apply(objects.cache("bert", uri, group, namespace=intruder))
    cluster.create(objects.isvc("bert", intruder, uri))
    claim = names.serving_pvc("bert", group)
    cluster.wait_bound(claim, namespace=intruder, timeout=120)
    sub_path = f"models/{keys.storage_key(uri)}"
    cluster.create(
        objects.digest_pod("reader", intruder, claim=claim, sub_path=sub_path, node=node)
    )
    status_key = keys.status_key("bert", intruder)

    def refused() -> str | None:
        assert _phase(cluster, "reader", intruder) in (None, "Pending"), (
            "the intruder's pod started: it mounted another tenant's private model"
        )
        for event in cluster.items("events", namespace=intruder):
            message = str(event.get("message") or "")
            if event.get("reason") == "FailedMount" and f"cache {status_key}" in message:
                return message
        return None

    message = cluster.wait(
        refused, timeout=180, what=f"a FailedMount Event of localcache naming cache {status_key}"
    )
    assert "localcache:" in message, message
    assert "not downloaded" in message, message
    assert cluster.node_status(node).get(status_key) != "ModelDownloaded"
    assert _phase(cluster, "reader", intruder) == "Pending"


def test_a_compliant_pods_deep_subpath_makes_no_directory_on_the_node(
    cluster: Cluster, sources: Sources
) -> None:
    """Security review finding 4, the subPath route: the kubelet made the 1100 levels of a
    compliant pod's subPath below the model folder on the node's disk, and the agent's walks
    then raised RecursionError on every pass. The view is read-only: the kubelet can make
    nothing in it, the pod does not start, and the agent goes on."""
    run = uuid.uuid4().hex[:6]
    group = f"g-{run}"
    node = cluster.node_names[0]
    sources.add_file(f"deep-{run}/model.onnx", os.urandom(4096))
    uri = f"{sources.http_base}/deep-{run}/model.onnx"
    tenant = cluster.namespace("deep")
    cluster.apply(cluster.node_group(group), objects.cache("deep", uri, group, namespace=tenant))
    cluster.create(objects.isvc("deep", tenant, uri))
    cluster.wait_ready(LMNC.plural, "deep", namespace=tenant, timeout=180)
    claim = names.serving_pvc("deep", group)
    cluster.wait_bound(claim, namespace=tenant)
    key = keys.storage_key(uri)
    sub_path = f"models/{key}/" + "/".join(["a"] * 1100)
    cluster.create(objects.digest_pod("deep", tenant, claim=claim, sub_path=sub_path, node=node))

    def refused() -> str | None:
        assert _phase(cluster, "deep", tenant) in (None, "Pending"), "the deep pod started"
        pod = cluster.get("pod", "deep", namespace=tenant) or {}
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") == "CreateContainerConfigError":
                return str(waiting.get("message") or "")
        return None

    message = cluster.wait(refused, timeout=120, what="the kubelet refuses the deep subPath")
    assert "subPath" in message or "subpath" in message, message
    assert not (cluster.models_root(node) / "models" / key / "a").exists()

    sources.add_file(f"deep-{run}/after.onnx", b"after")
    after = f"{sources.http_base}/deep-{run}/after.onnx"
    cluster.apply(objects.cache("after", after, group, namespace=tenant))
    cluster.wait_ready(LMNC.plural, "after", namespace=tenant, timeout=180)
