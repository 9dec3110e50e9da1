"""The test bed keeps to its own namespaces, cgroups and files, and leaves nothing behind.

A one-node test bed starts while the session's test bed runs (two on one machine do not
collide), after a crashed run whose owner was SIGKILLed: its start cleans up what that run
left. While it runs, the machine's own network namespace and default host paths are as
before; after `stop()` no process, cgroup, mount, link or file of either run remains.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localcache.devenv import cgroups, realnodes, testbed
from tests.e2e.realnodes.cluster import Cluster

pytestmark = pytest.mark.timeout(240)

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
