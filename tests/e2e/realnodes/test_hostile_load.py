"""The agent under a tenant's load (issue 20, security review finding 6), on real pods: a
tenant with the `edit` role creates 1000 suspended Jobs labelled for a node, 64 KiB of env
each. The agent of that node holds only what it reads of them: started again with all of them
there, its peak RSS (the first list included) stays under its container's 384 MiB limit, and
it is never OOM-killed. The RSS is printed (`-s` shows it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcache.agent.jobs import jobs
from tests.e2e.realnodes.cluster import LOCALCACHE_IMAGE, SYSTEM_NS, Cluster

pytestmark = pytest.mark.timeout(600)

HOSTILE_JOBS = 1000
ENV_BYTES = 64 * 1024
LIMIT_BYTES = 384 * 1024 * 1024
BATCH = 100


def _hostile_job(namespace: str, index: int, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"hostile-{index}",
            "namespace": namespace,
            "labels": {jobs.LABEL_NODE: jobs.label_value(node), jobs.LABEL_MODEL: "x"},
        },
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "c",
                            "image": LOCALCACHE_IMAGE,
                            "env": [{"name": "BLOB", "value": "x" * ENV_BYTES}],
                        }
                    ],
                }
            },
        },
    }


def _agent_process(node: str) -> int | None:
    """The pid of the agent process of `node` (the test bed's containers share the host's
    process namespace), found by its command line and NODE_NAME."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = b"agent" in cmdline and any(c.endswith(b"/localcache") for c in cmdline)
        if ours and f"NODE_NAME={node}".encode() in environ:
            return int(entry.name)
    return None


def _memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of `pid`, in bytes."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0]) * 1024
    return found


def _agent_pod(cluster: Cluster, node: str) -> dict[str, Any]:
    pods = cluster.items("pods", namespace=SYSTEM_NS, selector="app.kubernetes.io/component=agent")
    (pod,) = [p for p in pods if p["spec"].get("nodeName") == node]
    return pod


def test_the_agent_stays_under_its_limit_with_1000_hostile_jobs_for_its_node(
    cluster: Cluster,
) -> None:
    if not Path("/proc/self/environ").exists() or os.geteuid() != 0:
        pytest.skip("reading the agent's memory needs the test bed's host and root")
    node = cluster.node_names[0]
    attacker = cluster.namespace("hostile")
    user = f"tenant-{attacker}"
    cluster.kubectl(
        "create", "rolebinding", "tenant-edit", "-n", attacker, "--clusterrole=edit",
        f"--user={user}",
    )  # fmt: skip
    for start in range(0, HOSTILE_JOBS, BATCH):
        batch = [_hostile_job(attacker, i, node) for i in range(start, start + BATCH)]
        cluster.kubectl(
            f"--as={user}", "create", "-f", "-", input_text=yaml.safe_dump_all(batch), timeout=300
        )
    before = _agent_pod(cluster, node)
    # the agent starts again with all of them there (its informer's first list holds them all)
    cluster.kubectl("delete", "pod", "-n", SYSTEM_NS, str(before["metadata"]["name"]))

    def restarted_and_ready() -> dict[str, Any] | None:
        pod = _agent_pod(cluster, node)
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        fresh = pod["metadata"]["uid"] != before["metadata"]["uid"]
        return pod if fresh and statuses and all(c.get("ready") for c in statuses) else None

    pod = cluster.wait(restarted_and_ready, timeout=180, what=f"the agent of {node} ready again")
    pid = cluster.wait(
        lambda: _agent_process(node), timeout=30, what=f"the new agent process of {node}"
    )
    memory = _memory(pid)
    print(f"agent of {node} with {HOSTILE_JOBS} hostile Jobs, after a restart: {memory}")
    assert memory["VmHWM"] < LIMIT_BYTES, memory
    statuses = pod["status"]["containerStatuses"]
    assert all(c["restartCount"] == 0 for c in statuses), statuses
    cluster.kubectl("delete", "namespace", attacker, "--wait=false")
