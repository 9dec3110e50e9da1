"""What one tenant cannot do to the others on real nodes (issue 20, "What it must show"), as a
tenant with the built-in `edit` role, against the shipped manifests:

- a namespace cache with a ~900 KB `sourceModelUri` is refused at admission (finding 5), and
  another tenant's cache created after it still reaches the node, is downloaded and served;
- a namespace cache declaring a shared group's whole `storageLimit` is refused, naming the
  namespace's share (finding 9), and an admin's cache on that group still fits;
- a tenant's cache on a node group whose PV path is no models root the agent serves fails on
  its own: another tenant's cache of the same URI on a good group is downloaded and read.
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


def _as(cluster: Cluster, user: str, namespace: str, obj: Obj) -> tuple[bool, str]:
    done = cluster.kubectl(
        f"--as={user}", "create", "-n", namespace, "-f", "-",
        input_text=json.dumps(obj), check=False, timeout=120,
    )  # fmt: skip
    return done.returncode == 0, done.stderr


def _read(cluster: Cluster, pod: str, namespace: str) -> dict[str, str] | None:
    found = cluster.get("pod", pod, namespace=namespace) or {}
    phase = (found.get("status") or {}).get("phase")
    assert phase != "Failed", f"pod {namespace}/{pod} failed"
    if phase != "Succeeded":
        return None
    seen: dict[str, str] = json.loads(cluster.kubectl("logs", "-n", namespace, pod).stdout)
    return seen


def test_one_tenants_oversized_or_misplaced_caches_never_reach_another_tenants(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    node = cluster.node_names[0]
    group, unserved = f"g-{run}", f"unserved-{run}"
    data = os.urandom(32 * 1024)
    sources.add_file(f"bounds-{run}/model.onnx", data)
    sources.add_file(f"bounds-{run}/admin/model.onnx", os.urandom(1024))
    uri = f"{sources.http_base}/bounds-{run}/model.onnx"
    admin_uri = f"{sources.http_base}/bounds-{run}/admin/model.onnx"
    bad_group = cluster.node_group(unserved)
    bad_group["spec"]["persistentVolumeSpec"]["local"]["path"] = "/models"  # not served here
    cluster.apply(cluster.node_group(group), bad_group)
    attacker, victim = cluster.namespace("attacker"), cluster.namespace("victim")
    user = cluster.tenant(attacker)

    wide_uri = "https://models.example/" + "a" * 900_000
    wide = objects.cache("wide", wide_uri, group, namespace=attacker)
    admitted, why = _as(cluster, user, attacker, wide)
    assert not admitted, "a namespace cache with a 900 KB URI was admitted"
    assert "sourceModelUri" in why, why

    whole = objects.cache("whole", admin_uri + ".big", group, namespace=attacker, size="10Gi")
    admitted, why = _as(cluster, user, attacker, whole)
    assert not admitted, "one namespace declared a shared group's whole storageLimit"
    assert f"namespace {attacker} may declare at most 50%" in why, why

    misplaced = objects.cache("misplaced", uri, unserved, namespace=attacker)
    admitted, why = _as(cluster, user, attacker, misplaced)
    assert admitted, why
    cluster.apply(
        objects.cache("weights", uri, group, namespace=victim),
        objects.cache(f"admin-{run}", admin_uri, group, size="5Gi"),
    )
    cluster.create(objects.isvc("weights", victim, uri))
    cluster.wait_ready(LMNC.plural, "weights", namespace=victim, timeout=180)
    cluster.wait_ready(LMC.plural, f"admin-{run}", timeout=180)

    def misplaced_fails() -> str | None:
        progress = (cluster.get(LMNC.plural, "misplaced", namespace=attacker) or {}).get(
            "status"
        ) or {}
        states = set((progress.get("nodeStatus") or {}).values())
        return "failed" if states == {"NodeDownloadError"} else None

    cluster.wait(misplaced_fails, timeout=120, what=f"{attacker}/misplaced fails on its own")
    victim_status = (cluster.get(LMNC.plural, "weights", namespace=victim) or {})["status"]
    degraded = next(c for c in victim_status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False", degraded

    claim = names.serving_pvc("weights", group)
    cluster.wait_bound(claim, namespace=victim)
    sub_path = f"models/{keys.storage_key(uri)}"
    cluster.create(objects.digest_pod("reader", victim, claim=claim, sub_path=sub_path, node=node))
    seen = cluster.wait(
        lambda: _read(cluster, "reader", victim), timeout=180, what="the victim's pod reads"
    )
    assert seen == {"model.onnx": hashlib.sha256(data).hexdigest()}
