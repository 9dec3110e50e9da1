"""Folders shared only when the content is provably the same (issue 20, security review
finding 3), as the attacker: a tenant with the ordinary `edit` role in its own namespace
caches a popular URI first and, with `kubectl exec` into its own download pod, adds its own
bytes to the download. Another namespace's pods, served through the admin's cluster cache of
the same URI, then read the origin's bytes only: the tenant's download was never the open
copy, and the cluster cache's own download, which differs, got its own folder on the node.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from typing import Any

import pytest
import yaml

from localcache.agent import downloads
from localcache.agent.disk import layout
from localcache.api import groupversion
from localcache.caching import keys, names
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import Cluster, Sources
from tests.e2e.realnodes.objects import LMC, LMNC

Obj = dict[str, Any]
ISVC = groupversion.INFERENCE_SERVICE
PLANT = "import sys; open('/mnt/models/planted.bin', 'wb').write(b'attacker bytes')"

pytestmark = pytest.mark.timeout(420)


def test_a_tenants_own_bytes_never_reach_another_namespaces_pods(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    node = cluster.node_names[0]
    group = f"g-{run}"
    data = os.urandom(16 * 1024 * 1024)  # eight seconds at the slow server's rate
    sources.add_file(f"popular-{run}/model.bin", data)
    uri = f"{sources.slow_base}/popular-{run}/model.bin"
    key = keys.storage_key(uri)
    cluster.apply(cluster.node_group(group, selector={"kubernetes.io/hostname": node}))

    attacker = cluster.namespace("attacker")
    user = cluster.tenant(attacker)
    cache = objects.cache("popular", uri, group, namespace=attacker)
    cluster.kubectl(f"--as={user}", "apply", "-f", "-", input_text=yaml.safe_dump(cache))

    def download_pod() -> str | None:
        for pod in cluster.items("pods", namespace=attacker, selector=f"storageKey={key}"):
            if (pod.get("status") or {}).get("phase") == "Running":
                return str(pod["metadata"]["name"])
        return None

    pod = cluster.wait(download_pod, timeout=120, what=f"the tenant's download pod in {attacker}")
    planted = cluster.kubectl(
        f"--as={user}", "exec", "-n", attacker, pod, "--", "python3", "-c", PLANT, check=False
    )
    assert planted.returncode == 0, f"the tenant could not exec into its pod: {planted.stderr}"
    cluster.wait_ready(LMNC.plural, "popular", namespace=attacker, timeout=180)
    assert "planted.bin" in cluster.model_files(node, key), (
        "the attack did not land: the tenant's folder lacks its planted file"
    )

    cluster.apply(objects.cache(f"popular-{run}", uri, group))
    cluster.wait_ready(LMC.plural, f"popular-{run}", timeout=180)
    progress = (cluster.get(groupversion.LOCAL_MODEL_NODE.plural, node) or {}).get("status") or {}
    entry = (progress.get("modelProgress") or {}).get(f"popular-{run}") or {}
    variant = layout.variant_of_scope(downloads.scope_id(None))
    assert entry.get("folder") == f"{key}.{variant}", (
        f"the cluster cache's download, which differs, is not its own folder: {entry}"
    )
    assert cluster.model_files(node, f"{key}.{variant}") == {
        "model.bin": hashlib.sha256(data).hexdigest()
    }

    victim = cluster.namespace("victim")
    cluster.create(
        {
            "apiVersion": ISVC.api_version,
            "kind": ISVC.kind,
            "metadata": {"name": "popular", "namespace": victim},
            "spec": {"predictor": {"model": {"modelFormat": {"name": "onnx"}, "storageUri": uri}}},
        }
    )
    claim = names.serving_pvc(f"popular-{run}", group)
    cluster.wait_bound(claim, namespace=victim, timeout=120)
    sub_path = layout.model_subpath(key)
    cluster.create(objects.digest_pod("reader", victim, claim=claim, sub_path=sub_path, node=node))

    def finished() -> str | None:
        pod = cluster.get("pod", "reader", namespace=victim) or {}
        phase = (pod.get("status") or {}).get("phase")
        assert phase != "Failed", f"the victim's reader failed: {pod.get('status')}"
        return phase if phase == "Succeeded" else None

    cluster.wait(finished, timeout=180, what="the victim's pod reads the model")
    seen = json.loads(cluster.kubectl("logs", "-n", victim, "reader").stdout)
    assert seen == {"model.bin": hashlib.sha256(data).hexdigest()}, (
        f"the victim's pod read the tenant's bytes: {seen}"
    )
