"""A tainted GPU node gets an agent, and its models, with no edit of the agent DaemonSet.

One bed node is tainted `nvidia.com/gpu=present:NoSchedule` (as a cluster admin would), and its
agent pod deleted: the DaemonSet, as shipped, does not tolerate the taint, so no agent comes
back there. A node group whose selector picks that node and whose `spec.tolerations` tolerate
the taint makes the controller add the toleration to the DaemonSet; the agent runs on the node
again and a cache on that group is downloaded there. The taint is removed and the group deleted
afterwards, and the test waits for the agents' rollout, so the package's other tests find both
agents (the bed's reset between packages restores taints too).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from localcache.caching import agenttolerations as rules
from localcache.caching import keys
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import AGENT, SYSTEM_NS, Cluster, Sources
from tests.e2e.realnodes.objects import LMC

pytestmark = pytest.mark.timeout(600)
Obj = dict[str, Any]
TAINT = "nvidia.com/gpu=present:NoSchedule"
TOLERATION = {
    "key": "nvidia.com/gpu",
    "operator": "Equal",
    "value": "present",
    "effect": "NoSchedule",
}
ROLLOUT_TIMEOUT = "300s"


def _agent_pods(cluster: Cluster, node: str) -> list[Obj]:
    pods = cluster.items("pods", namespace=SYSTEM_NS, selector="app.kubernetes.io/component=agent")
    return [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]


def _ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@pytest.fixture
def tainted(cluster: Cluster) -> Iterator[str]:
    """The last bed node, tainted, without an agent; untainted and both agents rolled out
    again afterwards."""
    node = cluster.node_names[-1]
    cluster.kubectl("taint", "nodes", node, TAINT, "--overwrite")
    try:
        for pod in _agent_pods(cluster, node):
            cluster.kubectl(
                "delete", "pod", "-n", SYSTEM_NS, pod["metadata"]["name"], "--wait=true"
            )
        yield node
    finally:
        cluster.kubectl("taint", "nodes", node, f"{TAINT}-", check=False)
        cluster.kubectl(
            "rollout", "status", "-n", SYSTEM_NS, f"daemonset/{AGENT}",
            f"--timeout={ROLLOUT_TIMEOUT}",
        )  # fmt: skip


def test_a_node_group_s_tolerations_bring_the_agent_and_the_model_to_a_tainted_node(
    cluster: Cluster, sources: Sources, tainted: str
) -> None:
    node, run = tainted, uuid.uuid4().hex[:6]
    others = len(cluster.node_names) - 1

    def shipped_agents_skip_the_node() -> bool:
        ds = cluster.get("daemonset", AGENT, namespace=SYSTEM_NS) or {}
        wanted = (ds.get("status") or {}).get("desiredNumberScheduled")
        return wanted == others and not _agent_pods(cluster, node)

    cluster.wait(
        shipped_agents_skip_the_node,
        timeout=60,
        what=f"the shipped agent DaemonSet leaves the tainted node {node} without an agent",
    )

    group = f"gpu-{run}"
    spec = cluster.node_group(group, selector={"kubernetes.io/hostname": node})
    spec["spec"]["tolerations"] = [TOLERATION]
    data = os.urandom(256 * 1024)
    sources.add_file(f"gpu-{run}/model.bin", data)
    uri = f"{sources.http_base}/gpu-{run}/model.bin"
    cluster.apply(spec)
    try:

        def tolerated() -> Obj | None:
            ds = cluster.get("daemonset", AGENT, namespace=SYSTEM_NS) or {}
            pod_spec = ds["spec"]["template"]["spec"]
            return ds if TOLERATION in (pod_spec.get("tolerations") or []) else None

        ds = cluster.wait(
            tolerated, timeout=60, what=f"the agent DaemonSet tolerates {TAINT} (group {group})"
        )
        record = rules.parse_record(ds["metadata"]["annotations"].get(rules.RECORD_ANNOTATION))
        assert TOLERATION in (record or []), ds["metadata"]

        def agent_running() -> Obj | None:
            pods = [p for p in _agent_pods(cluster, node) if _ready(p)]
            return pods[0] if pods else None

        cluster.wait(agent_running, timeout=240, what=f"an agent pod runs, ready, on {node}")

        cluster.apply(objects.cache(f"gpu-{run}", uri, group))
        cluster.wait_ready(LMC.plural, f"gpu-{run}", timeout=240)
        assert cluster.model_files(node, keys.storage_key(uri)) == {
            "model.bin": hashlib.sha256(data).hexdigest()
        }
    finally:
        cluster.kubectl("delete", LMC.plural, f"gpu-{run}", "--ignore-not-found", "--wait=true")
        cluster.kubectl("delete", "localmodelnodegroups", group, "--ignore-not-found")

    def toleration_gone() -> bool:
        ds = cluster.get("daemonset", AGENT, namespace=SYSTEM_NS) or {}
        return TOLERATION not in (ds["spec"]["template"]["spec"].get("tolerations") or [])

    cluster.wait(toleration_gone, timeout=60, what="the deleted group's toleration goes away")
