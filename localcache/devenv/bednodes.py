"""The nodes of a test bed: wiring one into the hub (`wire`, for every node at start), and a
node that joins a running bed (`join`) or leaves it before the bed stops (`leave`).

A node that joins takes the next index never used in this run (its addresses, pod subnet,
state directory and cgroup are never a departed node's), gets routes both ways to the hub
and every node, the images given, and kubelet with the bed's node labels; `join` returns
once its Node is Ready, and removes whatever it started when it fails.

`leave` cordons it, stops its kubelet and containerd, kills every process left in its
network namespace (the containerd shims, which sit in the daemons cgroup; the namespace is
known by a descriptor held open since the node was wired, so its identity is never another's)
or below its cgroup (its pods), so its namespaces, links and mounts go with them, deletes its
Node object and removes the routes to it. What the bed runs is then what it ran before the
join; the node's state directory stays in the run directory until the bed stops.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from localcache.devenv import cgroups, node, nodeassets

if TYPE_CHECKING:
    from localcache.devenv.controlplane import ControlPlane
    from localcache.devenv.testbed import Image, TestBed

HUB_IP = "10.250.0.1"
BRIDGE = "lcbr0"
NODES_READY_TIMEOUT_S = 180.0
CONTAINERD_TIMEOUT_S = 60.0
MERGE = "application/merge-patch+json"


class NodeJoinError(RuntimeError):
    """A node could not join, or leave, the test bed."""


def wire(
    bed: TestBed, addr: node.NodeAddresses, others: Sequence[node.NodeAddresses]
) -> node.RealNode:
    """The node `addr`, added to the bed's nodes: its cgroup and namespaces, its link to the
    hub's bridge, the hub's route to its pod subnet and its own routes to `others`' (not
    started)."""
    plane = bed.control_plane
    bed.cgroups.create(addr.name)
    real = node.RealNode(
        addresses=addr,
        state_dir=bed.run_dir / addr.name,
        log_dir=bed.log_dir,
        bin_dir=nodeassets.node_binaries(),
        api_address=f"{HUB_IP}:{plane.api_port}",
        kubeconfig=bed.kubelet_kubeconfig(addr.name),
        client_ca=plane.cert_dir / "client-ca.crt",
        dns_ip=HUB_IP,
        cgroup_root=bed.cgroups.path(addr.name),
        preexec=bed.join_daemons,
    )
    real.create_namespace()
    # held open until the node leaves: the namespace's identity cannot be reused meanwhile
    real.netns_fd = os.open(f"/proc/{real.anchor.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    bed.node_list.append(real)  # from here on, `leave` (or the bed's stop) removes it
    veth = f"veth{addr.index}"
    pid = str(real.anchor.pid)
    bed.hub.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", pid])
    bed.hub.run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
    bed.hub.run(["ip", "route", "add", addr.pod_cidr, "via", addr.ip, "dev", BRIDGE])
    real.configure_namespace(list(others))
    return real


def import_images(real: node.RealNode, images: Sequence[Image]) -> None:
    for image in images:
        real.import_image(image.tarball, image.ref, *image.aliases)


def join(bed: TestBed, images: Sequence[Image]) -> node.RealNode:
    """One more node, Ready, holding `images` (see the module docstring)."""
    used = [int(p.name.split("-")[1]) for p in bed.run_dir.glob("node-*") if p.is_dir()]
    addr = node.NodeAddresses(max([0, *used]) + 1)
    members = list(bed.node_list)
    try:
        real = wire(bed, addr, [m.addresses for m in members])
        for member in members:
            member.anchor.run(["ip", "route", "add", addr.pod_cidr, "via", addr.ip, "dev", "eth0"])
        real.start_containerd()
        bed.wait_for(real.containerd_ready, CONTAINERD_TIMEOUT_S, f"containerd on {addr.name}")
        import_images(real, images)
        real.start_kubelet()
        bed.wait_for(
            lambda: addr.name in ready_nodes(bed.control_plane),
            NODES_READY_TIMEOUT_S,
            f"Node {addr.name} Ready",
        )
    except BaseException as exc:
        if any(n.name == addr.name for n in bed.node_list):
            try:
                leave(bed, addr.name)
            except Exception as cleanup:  # the join's own failure is the one to report
                exc.add_note(f"and {addr.name} could not leave: {cleanup}")
        raise
    return real


def leave(bed: TestBed, name: str) -> None:
    """Stop the node `name` and remove it from the bed and the cluster (module docstring)."""
    real = next((n for n in bed.node_list if n.name == name), None)
    if real is None or real.netns_fd is None:
        raise NodeJoinError(f"{name} is not a node of this test bed")
    netns = identity(os.fstat(real.netns_fd))
    path = f"/api/v1/nodes/{name}"
    # no new pod is bound to it while it stops (its Node stays Ready for a while)
    bed.control_plane.rest("PATCH", path, {"spec": {"unschedulable": True}}, content_type=MERGE)
    real.reap()
    cgroups.kill_until_none(lambda: _left_of(bed, name, netns), f"on {name}")
    status, body = bed.control_plane.rest("DELETE", path)
    if status not in (200, 404):
        raise NodeJoinError(f"{name}: deleting its Node answered {status}: {body}")
    bed.node_list.remove(real)
    unpin(real)
    addr = real.addresses
    bed.hub.run(["ip", "link", "del", f"veth{addr.index}"], check=False)
    bed.hub.run(["ip", "route", "del", addr.pod_cidr], check=False)
    for member in bed.node_list:
        member.anchor.run(["ip", "route", "del", addr.pod_cidr], check=False)


def unpin(real: node.RealNode) -> None:
    """Let go of the node's network namespace (after its processes are gone)."""
    if real.netns_fd is not None:
        os.close(real.netns_fd)
        real.netns_fd = None


def identity(found: os.stat_result) -> tuple[int, int]:
    return found.st_dev, found.st_ino


def netns_of(pid: int) -> tuple[int, int] | None:
    """The identity (device, inode) of `pid`'s network namespace; None once it is gone."""
    try:
        return identity(os.stat(f"/proc/{pid}/ns/net"))
    except OSError:
        return None


def _left_of(bed: TestBed, name: str, netns: tuple[int, int]) -> set[int]:
    """The bed's processes in the node's network namespace or below its cgroup."""
    left = bed.cgroups.pids(name) | {p for p in bed.cgroups.pids() if netns_of(p) == netns}
    return left - {os.getpid()}


def ready_nodes(plane: ControlPlane) -> set[str]:
    """The names of the cluster's Nodes whose Ready condition is True."""
    status, body = plane.rest("GET", "/api/v1/nodes")
    if status != 200:
        return set()
    return {
        item["metadata"]["name"]
        for item in body.get("items", [])
        for cond in item.get("status", {}).get("conditions", [])
        if cond.get("type") == "Ready" and cond.get("status") == "True"
    }
