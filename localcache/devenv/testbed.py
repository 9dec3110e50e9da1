"""The real-node test bed: a control plane bound for pods, kube-scheduler and N real nodes.

Topology (all of it inside namespaces the test bed creates; nothing in the host's own):

    host netns    pytest, kubectl ── nsforward (127.0.0.1:P → hub 127.0.0.1:P) ──┐
    hub netns     bridge lcbr0 10.250.0.1/24; etcd, kube-apiserver (0.0.0.0:P),  ◀┘
                  kube-controller-manager, kube-scheduler, test servers;
                  routes 10.244.(i-1).0/24 via node i
    node-i netns  eth0 10.250.0.(10+i) (veth to lcbr0), cni0 10.244.(i-1).1/24,
    (+ mount ns)  containerd, kubelet, pods; private /var/lib, /run, /var/log, /mnt

Rules it keeps (shared/reference/real-nodes/README.md): addresses live only in its own network
namespaces and no namespace has a default route; every process it starts, and every pod, sits
in a cgroup below the starting process's own (`cgroups.CgroupTree`); files live under one run
directory, never at default host paths; names and ports of two test beds never collide (their
bridges and subnets are private to their hub namespaces; host ports are reserved); `stop()`
kills everything in its cgroup tree, so the namespaces, links and mounts go with the
processes, then removes the cgroups and the run directory; `start()` first cleans up what a
crashed run left (its owner process is gone).

`join()` adds a node to a running bed and `leave()` removes one (`bednodes`).

`TestBed.unavailable_reason()` says in one line why this machine cannot host it, or None.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localcache.devenv import bednodes, cgroups, netns, node, nodeassets
from localcache.devenv.assets import find_binaries, free_port, release_port
from localcache.devenv.bednodes import CONTAINERD_TIMEOUT_S, NODES_READY_TIMEOUT_S
from localcache.devenv.controlplane import ControlPlane

HUB_IP = bednodes.HUB_IP
BRIDGE = bednodes.BRIDGE
CGROUP_PREFIX = "localcache-testbed-"
SERVING_NAMES = (
    HUB_IP,
    node.KUBERNETES_SERVICE_IP,
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


class TestBedError(RuntimeError):
    """The test bed could not be started."""


@dataclass(frozen=True)
class Image:
    """An image tarball to import into every node, and the names it should also answer to."""

    ref: str
    tarball: Path
    aliases: tuple[str, ...] = ()


def runs_root() -> Path:
    return Path(tempfile.gettempdir()) / "localcache-testbed"


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def unavailable_reason() -> str | None:
    """Why a test bed cannot start right now, in one line; None when it can."""
    return nodeassets.host_unsupported_reason() or nodeassets.missing_assets()


def clean_stale_runs() -> list[str]:
    """Remove what test beds whose owner process is gone left behind; returns their names."""
    cleaned, known = clean_stale_run_dirs(runs_root())
    return cleaned + _clean_orphan_cgroups(known, cleaned)


def clean_stale_run_dirs(root: Path) -> tuple[list[str], set[str]]:
    """Remove the runs under `root` whose owner is gone, with their cgroups; returns their
    names and those of every run found (one being published, `.<run>`, counts as `<run>`)."""
    cleaned: list[str] = []
    known: set[str] = set()
    for run_dir in sorted(root.glob("*")) if root.is_dir() else []:
        known.add(run_dir.name.removeprefix("."))
        try:
            state = json.loads((run_dir / "state.json").read_text())
        except (OSError, ValueError):
            if run_dir.name.startswith("."):
                continue  # a run being published (`TestBed.start`): its state is not written yet
            state = {}
        owner = int(state.get("owner_pid", 0))
        if owner and _start_time(owner) == state.get("owner_start"):
            continue
        if "cgroup_root" in state:
            tree = cgroups.CgroupTree(tuple(cgroups.own_hierarchies()), state["cgroup_root"])
            tree.kill_all()
            tree.remove()
        shutil.rmtree(run_dir, ignore_errors=True)
        cleaned.append(run_dir.name)
    return cleaned, known


def _clean_orphan_cgroups(known: set[str], cleaned: list[str]) -> list[str]:
    """Kill and remove the cgroups of runs whose directory is gone (a crash mid-clean-up)."""
    found: list[str] = []
    probe = cgroups.CgroupTree.below_own("probe")
    parent = probe.root.rsplit("/", 1)[0]
    first = probe.hierarchies[0]
    holder = first.mount / parent.lstrip("/")
    for entry in sorted(holder.glob(f"{CGROUP_PREFIX}*")) if holder.is_dir() else []:
        run_name = entry.name.removeprefix(CGROUP_PREFIX)
        if run_name in known and run_name not in cleaned:
            continue
        tree = cgroups.CgroupTree(probe.hierarchies, f"{parent}/{entry.name}")
        tree.kill_all()
        tree.remove()
        found.append(run_name)
    return found


@dataclass
class TestBed:
    """etcd, kube-apiserver, KCM and kube-scheduler in a hub namespace, plus `nodes` nodes."""

    __test__ = False  # not a pytest test class

    nodes: int = 2
    images: Sequence[Image] = ()
    control_plane: ControlPlane = field(init=False)
    node_list: list[node.RealNode] = field(default_factory=list, init=False)

    def start(self) -> TestBed:
        reason = unavailable_reason()
        if reason:
            raise TestBedError(reason)
        clean_stale_runs()
        self.run_id = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.run_dir = runs_root() / self.run_id
        self.log_dir = self.run_dir / "logs"
        self.cgroups = cgroups.CgroupTree.below_own(CGROUP_PREFIX + self.run_id)
        # published with its state in one rename: another bed starting at the same time (a
        # second pytest-xdist worker) never sees this run without its owner and removes it
        staging = runs_root() / f".{self.run_id}"
        (staging / "logs").mkdir(parents=True)
        (staging / "state.json").write_text(
            json.dumps(
                {
                    "owner_pid": os.getpid(),
                    "owner_start": _start_time(os.getpid()),
                    "cgroup_root": self.cgroups.root,
                }
            )
        )
        staging.rename(self.run_dir)
        self._forwarders: list[tuple[subprocess.Popen[str], list[int]]] = []
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def join_daemons(self) -> None:
        self.cgroups.join("daemons")

    def _start(self) -> None:
        started = time.monotonic()
        self.cgroups.create("daemons")
        self.hub = netns.Anchor("hub", self.log_dir).start(mount=False, preexec=self.join_daemons)
        self.hub.script(
            f"""
            ip link set lo up
            ip link add {BRIDGE} type bridge
            ip addr add {HUB_IP}/24 dev {BRIDGE}
            ip link set {BRIDGE} up
            """
        )
        plane = ControlPlane(
            with_kcm=True,
            bin_dir=find_binaries(),
            launch_prefix=self.hub.prefix(),
            preexec=self.join_daemons,
            serving_names=SERVING_NAMES,
            work_root=self.run_dir,
        )
        self.control_plane = plane
        plane.apiserver_flags = {
            "bind-address": "0.0.0.0",
            "advertise-address": HUB_IP,
            "endpoint-reconciler-type": "lease",
            "service-account-issuer": "https://kubernetes.default.svc",
            "disable-admission-plugins": "",
            "enable-admission-plugins": "NodeRestriction",
            "authorization-mode": "Node,RBAC",
            "kubelet-client-certificate": str(plane.admin.cert_path),
            "kubelet-client-key": str(plane.admin.key_path),
            "kubelet-preferred-address-types": "InternalIP",
            "enable-aggregator-routing": "true",
        }
        plane.kcm_flags = {
            "controllers": "*",
            "root-ca-file": str(plane.ca_path),
            "service-account-private-key-file": str(plane.cert_dir / "sa.key"),
        }
        self.scheduler_port = free_port()
        self.forward(
            [plane.etcd_port, plane.api_port, plane.kcm_port, self.scheduler_port],
            host="127.0.0.1",
            same_port=True,
        )
        addresses = [node.NodeAddresses(i) for i in range(1, self.nodes + 1)]
        for addr in addresses:
            bednodes.wire(self, addr, [o for o in addresses if o is not addr])
        for real in self.node_list:
            real.start_containerd()
        plane.start()
        self._start_scheduler()
        self.wait_for(
            lambda: all(n.containerd_ready() for n in self.node_list),
            CONTAINERD_TIMEOUT_S,
            "containerd answering on every node",
        )
        with concurrent.futures.ThreadPoolExecutor(len(self.node_list)) as pool:
            for _ in pool.map(self._import_images, self.node_list):
                pass
        for real in self.node_list:
            real.start_kubelet()
        self.wait_for(self._nodes_ready, NODES_READY_TIMEOUT_S, "every Node Ready")
        self.startup_seconds = time.monotonic() - started

    def _import_images(self, real: node.RealNode) -> None:
        bednodes.import_images(real, self.images)

    def join(self, images: Sequence[Image] | None = None) -> node.RealNode:
        """One more node, Ready, with `images` (default: the bed's); `leave` removes it."""
        return bednodes.join(self, self.images if images is None else images)

    def leave(self, name: str) -> None:
        """Stop the node `name` and remove it from the bed and the cluster."""
        bednodes.leave(self, name)

    def kubelet_kubeconfig(self, node_name: str) -> Path:
        plane = self.control_plane
        creds = plane.add_user(f"system:node:{node_name}", ["system:nodes"])
        config = plane.kubeconfig(creds)
        config["clusters"][0]["cluster"]["server"] = f"https://{HUB_IP}:{plane.api_port}"
        path = self.run_dir / f"kubelet-{node_name}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def _start_scheduler(self) -> None:
        plane = self.control_plane
        creds = plane.add_user("system:kube-scheduler", [])
        kubeconfig = plane.write_kubeconfig(creds, self.run_dir / "scheduler.kubeconfig")
        args = [
            str(nodeassets.node_binaries() / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.scheduler_port}",
        ]
        proc = plane._launch("kube-scheduler", args)
        url = f"https://127.0.0.1:{self.scheduler_port}/healthz"
        plane._wait(proc, lambda: plane._http_ok(url, verify=False), "kube-scheduler /healthz")

    def forward(
        self, ports: Sequence[int], *, host: str = HUB_IP, same_port: bool = False
    ) -> list[int]:
        """Host loopback ports that reach `host:port` in the hub namespace, one per port:
        fresh ones, or with `same_port` the ports themselves (already reserved on the host,
        as the control plane's are)."""
        host_ports = list(ports) if same_port else [free_port() for _ in ports]
        args = [
            sys.executable,
            "-m",
            "localcache.devenv.nsforward",
            "--netns",
            self.hub.netns_path,
        ]
        for local, remote in zip(host_ports, ports, strict=True):
            args += ["--map", f"127.0.0.1:{local}={host}:{remote}"]
        log = open(self.log_dir / "nsforward.log", "ab")  # noqa: SIM115 - for the child
        try:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
                preexec_fn=self.join_daemons,
            )
        finally:
            log.close()
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise TestBedError(f"port forwarder did not start: {line!r}")
        self._forwarders.append((proc, [] if same_port else host_ports))
        return host_ports

    def _nodes_ready(self) -> bool:
        return bednodes.ready_nodes(self.control_plane) >= {n.name for n in self.node_list}

    def wait_for(self, ready: Any, timeout: float, what: str) -> None:
        """Poll `ready` until true; TestBedError past `timeout`, or once a node's process
        exited."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [name for real in self.node_list for name in real.exited()]
            if dead:
                raise TestBedError(
                    f"{', '.join(dead)} exited before {what}; logs in {self.log_dir}"
                )
            if ready():
                return
            time.sleep(0.2)
        raise TestBedError(f"{what}: not within {timeout:.0f}s; logs in {self.log_dir}")

    def node(self, name: str) -> node.RealNode:
        return next(n for n in self.node_list if n.name == name)

    def stop(self) -> None:
        """Kill everything the test bed started; remove its cgroups, namespaces and files."""
        tree = getattr(self, "cgroups", None)
        if tree is not None:
            tree.kill_all()
        for real in self.node_list:
            real.reap()
            bednodes.unpin(real)
        hub = getattr(self, "hub", None)
        if hub is not None:
            hub.stop()
        for proc, ports in getattr(self, "_forwarders", []):
            proc.wait(5)
            if proc.stdout:
                proc.stdout.close()
            for port in ports:
                release_port(port)
        plane = getattr(self, "control_plane", None)
        if plane is not None:
            plane.stop()
        run_dir = getattr(self, "run_dir", None)
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)
        if tree is not None:
            tree.remove()
