"""One real Kubernetes node of the test bed: containerd + kubelet in namespaces of its own.

A node is a network + private mount namespace held by an anchor process. Inside it:
- `eth0` (a veth whose other end joins the test bed's bridge in the hub namespace), routes to
  the other nodes' pod subnets, and no default route: no packet can leave the machine;
- private bind mounts over `/var/lib`, `/run`, `/var/log`, `/mnt` and `/models`, so kubelet
  and containerd keep their default paths and every node has its own `/mnt/models` and
  `/models` (KServe's default models root), and nothing is written at those paths on the host
  (only `/models`, when the host lacks it, is created there as an empty mount point, and kept:
  other test beds may have their own mounts on it);
- private copies of the kernel tunables kubelet writes (the host keeps its own values);
- a DNAT from the `kubernetes` Service address to the apiserver, standing in for kube-proxy
  for that one Service;
- containerd (CRI, runc, CNI bridge + host-local) and kubelet, both in the test bed's cgroup;
  kubelet's `cgroupRoot` is this node's cgroup, below the test bed's.

The host fixes come from the study in `shared/reference/real-nodes`: `restrict_oom_score_adj`
(the machine lacks CAP_SYS_RESOURCE) and `failCgroupV1: false` (cgroup v1 hosts).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from localcache.devenv import netns, processes

NODE_LABELS = {"kserve/localmodel": "worker"}
KUBERNETES_SERVICE_IP = "10.0.0.1"
PAUSE_IMAGE = "localhost/localcache/pause:3.10"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_NAMESPACE_SETUP = r"""
ip link set lo up
ip addr add "$NODE_IP/24" dev eth0
ip link set eth0 up
for r in $ROUTES; do ip route add "${r%=*}" via "${r#*=}" dev eth0; done
sysctl -qw net.ipv4.ip_forward=1
iptables -t nat -A PREROUTING -d "$SERVICE_IP/32" -p tcp --dport 443 -j DNAT \
  --to-destination "$API_ADDR"
iptables -t nat -A OUTPUT -d "$SERVICE_IP/32" -p tcp --dport 443 -j DNAT \
  --to-destination "$API_ADDR"
for d in /var/lib /run /var/log /mnt /models; do
  mkdir -p "$STATE/bind$d" "$d"; mount --bind "$STATE/bind$d" "$d"
done
mkdir -p /mnt/models
chmod 0755 /mnt/models
for f in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops \
         kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
  g="$STATE/sysctl-${f//\//_}"; cat "/proc/sys/$f" > "$g"; mount --bind "$g" "/proc/sys/$f"
done
mkdir -p "$STATE/cgkeep"
mount --rbind /sys/fs/cgroup "$STATE/cgkeep"
mount -t sysfs sysfs /sys
mount --rbind "$STATE/cgkeep" /sys/fs/cgroup
umount -l "$STATE/cgkeep"
"""


@dataclass
class NodeAddresses:
    index: int  # 1-based

    @property
    def name(self) -> str:
        return f"node-{self.index}"

    @property
    def ip(self) -> str:
        return f"10.250.0.{10 + self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"10.244.{self.index - 1}.0/24"


@dataclass
class RealNode:
    """A node of the test bed; `start()` returns once containerd serves and kubelet runs."""

    addresses: NodeAddresses
    state_dir: Path
    log_dir: Path
    bin_dir: Path  # kubelet, containerd, containerd-shim-runc-v2, ctr
    api_address: str  # host_ip:port of the apiserver as the node sees it
    kubeconfig: Path
    client_ca: Path
    dns_ip: str
    cgroup_root: str
    preexec: Callable[[], None]
    anchor: netns.Anchor = field(init=False)
    netns_fd: int | None = field(default=None, init=False)  # pins its network namespace
    _procs: list[processes.ManagedProcess] = field(default_factory=list, init=False)

    @property
    def name(self) -> str:
        return self.addresses.name

    @property
    def containerd_socket(self) -> Path:
        return self.state_dir / "bind" / "run" / "containerd" / "containerd.sock"

    @property
    def models_dir(self) -> Path:
        """The node's `/mnt/models` as seen from the host."""
        return self.state_dir / "bind" / "mnt" / "models"

    @property
    def kserve_models_dir(self) -> Path:
        """The node's `/models` (KServe's default models root) as seen from the host."""
        return self.state_dir / "bind" / "models"

    def create_namespace(self) -> netns.Anchor:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.anchor = netns.Anchor(self.name, self.log_dir).start(mount=True, preexec=self.preexec)
        return self.anchor

    def configure_namespace(self, other_nodes: list[NodeAddresses]) -> None:
        routes = " ".join(f"{o.pod_cidr}={o.ip}" for o in other_nodes)
        self.anchor.script(
            _NAMESPACE_SETUP,
            mount=True,
            env={
                "NODE_IP": self.addresses.ip,
                "ROUTES": routes,
                "SERVICE_IP": KUBERNETES_SERVICE_IP,
                "API_ADDR": self.api_address,
                "STATE": str(self.state_dir),
            },
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        proc = processes.ManagedProcess(
            f"{self.name} {name}",
            [*self.anchor.prefix(mount=True), *args],
            self.log_dir / f"{self.name}-{name}.log",
            env={"PATH": f"{self.bin_dir}:{SYSTEM_PATH}"},
            preexec=self.preexec,
        )
        proc.start()
        self._procs.append(proc)

    def reap(self) -> None:
        """Stop the node's processes (the test bed has usually killed them already)."""
        for proc in self._procs:
            proc.stop()
        if hasattr(self, "anchor"):
            self.anchor.stop()

    def exited(self) -> list[str]:
        """The node's processes that exited (empty while all run), by name."""
        return [proc.name for proc in self._procs if not proc.running()]

    # ----------------------------------------------------------------------- containerd

    def _containerd_config(self) -> Path:
        cni_dir = self.state_dir / "cni"
        cni_dir.mkdir(exist_ok=True)
        conflist = {
            "cniVersion": "0.4.0",
            "name": "testbed-pods",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.addresses.pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.state_dir / "cni-ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (cni_dir / "10-testbed.conflist").write_text(json.dumps(conflist, indent=2))
        config = f"""version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  netns_mounts_under_state_dir = true
  # No CAP_SYS_RESOURCE here: runc cannot write a negative oom_score_adj; clamp instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni_dir}"
"""
        path = self.state_dir / "containerd.toml"
        path.write_text(config)
        return path

    def start_containerd(self) -> None:
        config = self._containerd_config()
        self._spawn("containerd", [str(self.bin_dir / "containerd"), "--config", str(config)])

    def containerd_ready(self) -> bool:
        return self.ctr("version", check=False).returncode == 0

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [
                str(self.bin_dir / "ctr"),
                "--address",
                str(self.containerd_socket),
                "-n",
                "k8s.io",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise netns.NamespaceError(f"{self.name}: ctr {' '.join(args)}: {done.stderr.strip()}")
        return done

    def import_image(self, tarball: Path, ref: str, *aliases: str) -> None:
        self.ctr("images", "import", str(tarball))
        for alias in aliases:
            self.ctr("images", "tag", "--force", ref, alias)

    # -------------------------------------------------------------------------- kubelet

    def start_kubelet(self) -> None:
        resolv = self.state_dir / "resolv.conf"
        resolv.write_text(f"nameserver {self.dns_ip}\n")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.addresses.ip,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.client_ca)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,
            "failSwapOn": False,
            "resolvConf": str(resolv),
            "clusterDomain": "cluster.local",
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "maxPods": 60,
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "podPidsLimit": 4096,
        }
        path = self.state_dir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
        self._spawn(
            "kubelet",
            [
                str(self.bin_dir / "kubelet"),
                f"--config={path}",
                f"--kubeconfig={self.kubeconfig}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.addresses.ip}",
                f"--node-labels={labels}",
                "--v=1",
            ],
        )
