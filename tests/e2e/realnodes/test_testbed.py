"""The test bed keeps to its own namespaces, cgroups and files, and leaves nothing behind.

A one-node test bed starts while the session's test bed runs (two on one machine do not
collide), after a crashed run whose owner was SIGKILLed: its start cleans up what that run
left; a node joins it and leaves again. While it runs, the machine's own network namespace
and default host paths are as before; after `stop()` no process, cgroup, mount, link or file
of either run remains.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localcache.devenv import bednodes, cgroups, realnodes, testbed, waiting
from tests.e2e.realnodes.cluster import Cluster

pytestmark = pytest.mark.timeout(360)

DEFAULT_PATHS = (
    "/mnt/models",
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/run/containerd",
    "/etc/cni/net.d",
    "/var/lib/cni",
)

_CRASHING_RUN = """
import json, sys, time
from pathlib import Path
from localcache.devenv import testbed
pause = testbed.Image(ref=sys.argv[1], tarball=Path(sys.argv[2]))
bed = testbed.TestBed(nodes=1, images=[pause]).start()
print(json.dumps({"run_dir": str(bed.run_dir), "cgroup": bed.cgroups.root}), flush=True)
time.sleep(3600)
"""


def _host_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def _host_mounts() -> set[str]:
    return {line.split(" ")[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def _cgroup_exists(root: str) -> bool:
    return any((h.mount / root.lstrip("/")).exists() for h in cgroups.own_hierarchies())


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _run_pause_pod(bed: testbed.TestBed, node: str, image: str) -> dict[str, object]:
    """A pod of `image` bound to `node`, once Running (its status)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"on-{node}", "namespace": "default"},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "containers": [{"name": "pause", "image": image, "imagePullPolicy": "Never"}],
        },
    }
    plane = bed.control_plane
    path = f"/api/v1/namespaces/default/pods/on-{node}"

    def created() -> bool:  # the default ServiceAccount appears a moment after the start
        status, _ = plane.rest("POST", "/api/v1/namespaces/default/pods", pod)
        return status in (201, 409)

    def running() -> dict[str, object]:  # empty (falsy) until Running
        status, body = plane.rest("GET", path)
        found: dict[str, object] = (body.get("status") or {}) if status == 200 else {}
        return found if found.get("phase") == "Running" else {}

    waiting.wait_until_sync(created, timeout=60, interval=0.5, what=f"a pod created on {node}")
    return waiting.wait_until_sync(
        running, timeout=120, interval=0.5, what=f"the pod on {node} Running"
    )


def test_a_second_test_bed_starts_cleans_a_crashed_run_and_leaves_nothing_behind(
    cluster: Cluster,
) -> None:
    if cluster.node_models_dir is None:
        pytest.skip("the test bed's own behaviour is checked only where it runs")
    (pause,) = realnodes.prepare_images(["pause"])
    links, mounts = _host_links(), _host_mounts()

    crashed = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_RUN, pause.ref, str(pause.tarball)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert crashed.stdout is not None
    line = crashed.stdout.readline()
    assert line, f"the crashing run did not start (exit {crashed.poll()})"
    left = json.loads(line)
    crashed.kill()
    crashed.wait(10)
    crashed.stdout.close()
    stale = cgroups.CgroupTree(tuple(cgroups.own_hierarchies()), left["cgroup"])
    assert stale.pids(), "the crashed run left no processes: the test cannot show clean-up"

    bed = testbed.TestBed(nodes=1, images=[pause])
    try:
        bed.start()
        assert not stale.pids(), "processes of the crashed run survive the next start"
        assert not Path(left["run_dir"]).exists()
        assert not _cgroup_exists(left["cgroup"])
        own = max((h.own for h in cgroups.own_hierarchies()), key=len)
        assert bed.cgroups.root.startswith(own.rstrip("/") + "/")
        assert bed.cgroups.pids(), "the test bed's processes are not in its cgroup"
        assert _host_links() == links, "the test bed added links to the host's namespace"
        for path in DEFAULT_PATHS:
            assert not os.path.exists(path), f"{path} was created on the host"
        assert (bed.node("node-1").models_dir).is_dir()
        # a node joins the running bed, runs a pod, and leaves without a trace but its state
        # directory: the pod, and the containerd shim in the node's network namespace, go too
        joined = bed.join()
        assert joined.name == "node-2"
        running = _run_pause_pod(bed, "node-2", pause.ref)
        assert joined.netns_fd is not None
        node_netns = bednodes.identity(os.fstat(joined.netns_fd))
        in_node = {p for p in bed.cgroups.pids() if bednodes.netns_of(p) == node_netns}
        shims = [p for p in in_node if _comm(p).startswith("containerd-shim")]
        assert shims, f"no containerd shim in node-2's network namespace: {running}"
        bed.leave("node-2")
        assert [n.name for n in bed.node_list] == ["node-1"]
        assert bed.control_plane.rest("GET", "/api/v1/nodes/node-2")[0] == 404
        assert not bed.cgroups.pids("node-2"), "the pod of the node that left survives"
        assert not {p for p in bed.cgroups.pids() if bednodes.netns_of(p) == node_netns}, (
            "its shim survives"
        )
        assert "veth2" not in bed.hub.run(["ip", "-o", "link"]).stdout
        assert joined.addresses.pod_cidr not in bed.hub.run(["ip", "route"]).stdout
        # the session's test bed is undisturbed by a second one
        nodes = cluster.items("nodes")
        assert all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
            for n in nodes
        )
    finally:
        bed.stop()
    assert not bed.run_dir.exists()
    assert not _cgroup_exists(bed.cgroups.root)
    assert _host_links() == links
    assert _host_mounts() == mounts
    assert testbed.clean_stale_runs() == []
