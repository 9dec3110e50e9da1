"""What real nodes need from the machine: root, network and mount namespaces, cgroups, and
what `hack/build-node.sh` builds or installs (kubelet, kube-scheduler, containerd, runc, CNI
plugins, iptables). Each check answers in one line why a test bed cannot start, or None.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from localcache.devenv import cgroups
from localcache.devenv.assets import ControlPlaneError, find_binaries

CNI_PLUGINS = Path("/usr/lib/cni")


def node_binaries() -> Path:
    """The directory `hack/build-node.sh` fills for the control plane's version."""
    explicit = os.environ.get("LOCALCACHE_NODE_BIN")
    if explicit:
        return Path(explicit)
    base = os.environ.get("LOCALCACHE_NODE_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "localcache" / "node"
    )
    return Path(base) / find_binaries().name


def host_unsupported_reason() -> str | None:
    """Why this machine cannot host real nodes at all, in one line; None when it can."""
    if os.geteuid() != 0:
        return "real nodes need root (network and mount namespaces, cgroups, mounts)"
    try:
        subprocess.run(["unshare", "--net", "--mount", "true"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return "cannot create network and mount namespaces here (unshare --net --mount failed)"
    try:
        cgroups.CgroupTree.below_own("probe")
    except cgroups.CgroupError as exc:
        return str(exc)
    return None


def missing_assets() -> str | None:
    """What `hack/build-node.sh` still has to build or install, in one line; None if nothing."""
    try:
        bins = node_binaries()
    except ControlPlaneError as exc:
        return str(exc)
    for binary in ("kubelet", "kube-scheduler", "containerd", "containerd-shim-runc-v2", "ctr"):
        if not os.access(bins / binary, os.X_OK):
            return f"no {binary} in {bins}: run hack/build-node.sh"
    for tool in ("runc", "iptables", "ip", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed: run hack/build-node.sh"
    if not (CNI_PLUGINS / "bridge").exists():
        return f"no CNI plugins in {CNI_PLUGINS}: run hack/build-node.sh"
    return None
