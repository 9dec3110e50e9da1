"""The one real-node test bed of a test run, shared by the end-to-end packages.

`SharedBed.start()` starts a `devenv.testbed.TestBed` of two nodes with every image the e2e
packages use (the operator's, KServe's add-on's, KServe's serving controllers' and the stand-in
model server's), and the test servers in its hub
namespace: an HTTP model server, a throttled one over the same files, and an S3 store that
enforces credentials; and a ReadWriteMany export both nodes mount (`tests.support.sharedvolume`:
why it is not NFS). Each package brings the bed to the state it needs and leaves the rest to
`reset()`, which a package calls before it deploys anything:

`reset()` puts the cluster back as the bed started it, whatever a package left: a node a test
joined and left behind is removed; serving objects and caches are deleted, through the
finalizers of an operator that still runs (dropped after `FINALIZER_GRACE_S` when none
answers), then every namespace (those running a DaemonSet, the operator's node plugin,
last), CRD, PV and cluster-scoped object that was not there at the start (`Baseline`), Helm's
release records and the Events in `default`; then node labels and taints are restored and
both models roots of every node (`/mnt/models` and `/models`) and the shared export are
emptied. The test servers keep their files and counters: tests name their models uniquely
and count requests per path.

`join_node()` adds a third node for one test and `leave_node()` removes it (`devenv.bednodes`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcache.devenv import modelserver, realnodes, testbed, waiting
from tests.support import objectstore, sharedvolume

Obj = dict[str, Any]
HTTP_PORT, SLOW_PORT, S3_PORT = 8000, 8001, 9000
SLOW_RATE = 2 * 1024 * 1024  # bytes per second of the throttled server
IMAGES = (
    *realnodes.OPERATOR_IMAGES,
    *realnodes.KSERVE_ADDON_IMAGES,
    *realnodes.KSERVE_CONTROLLER_IMAGES,
)
FINALIZER_GRACE_S = 60.0
GONE_TIMEOUT_S = 180.0
SERVING_KINDS = ("inferenceservices", "llminferenceservices")
CACHE_KINDS = ("localmodelnamespacecaches", "localmodelcaches", "localmodelnodegroups")
# cluster-scoped kinds installs create; everything of them not in the baseline is deleted
CLUSTER_KINDS = (
    "clusterroles",
    "clusterrolebindings",
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
    "priorityclasses",
    "storageclasses",
    "csidrivers",
    "persistentvolumes",
)
ADMISSION_KINDS = CLUSTER_KINDS[2:6]


@dataclass(frozen=True)
class Baseline:
    """What the bed's cluster held right after it started."""

    namespaces: frozenset[str]
    crds: frozenset[str]
    cluster_objects: frozenset[tuple[str, str]]  # (kind, name)
    node_labels: dict[str, dict[str, str]]
    node_taints: dict[str, list[Obj]]


@dataclass
class SharedBed:
    """The bed, its test servers and kubectl on it; see the module docstring."""

    bed: testbed.TestBed = field(init=False)
    work: Path = field(init=False)
    http_dir: Path = field(init=False)
    http: modelserver.ModelServer = field(init=False)
    slow: modelserver.ModelServer = field(init=False)
    store: objectstore.ObjectStore = field(init=False)
    images: dict[str, str] = field(init=False)  # image name (hack/build-images.sh) -> ref
    kubectl: realnodes.Kubectl = field(init=False)
    shared_dir: Path = field(init=False)  # the ReadWriteMany export, as host and nodes see it
    baseline: Baseline = field(init=False)
    _servers: list[modelserver.ModelServer | objectstore.ObjectStore] = field(
        default_factory=list, init=False
    )

    def start(self) -> SharedBed:
        built = realnodes.prepare_images(IMAGES)
        self.images = {name: image.ref for name, image in zip(IMAGES, built, strict=True)}
        self.work = Path(tempfile.mkdtemp(prefix="localcache-e2e-"))
        self.http_dir = self.work / "http"
        self.http_dir.mkdir()
        self.bed = testbed.TestBed(nodes=2, images=built)
        try:
            self.bed.start()
            self.shared_dir = sharedvolume.export(self.bed.run_dir)
            self._start_servers()
            plane = self.bed.control_plane
            assert plane.kubectl_path is not None
            self.kubectl = realnodes.kubectl_runner(
                plane.kubectl_path, plane.kubeconfig_path, self.work
            )
            self.baseline = self._read_baseline()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_servers(self) -> None:
        prefix = self.bed.hub.prefix()
        host_http, host_slow, host_s3 = (
            f"http://127.0.0.1:{p}" for p in self.bed.forward([HTTP_PORT, SLOW_PORT, S3_PORT])
        )
        self.http = modelserver.ModelServer(self.http_dir, log_path=self.work / "http.log")
        self._servers.append(self.http.start(prefix, testbed.HUB_IP, HTTP_PORT, reach=host_http))
        self.slow = modelserver.ModelServer(
            self.http_dir, rate=SLOW_RATE, log_path=self.work / "slow.log"
        )
        self._servers.append(self.slow.start(prefix, testbed.HUB_IP, SLOW_PORT, reach=host_slow))
        self.store = objectstore.ObjectStore(log_path=self.work / "s3.log")
        self._servers.append(self.store.start(prefix, testbed.HUB_IP, S3_PORT, reach=host_s3))

    def stop(self) -> None:
        for server in reversed(self._servers):
            server.stop()
        self._servers.clear()
        if hasattr(self, "bed"):
            self.bed.stop()
        if hasattr(self, "work"):
            shutil.rmtree(self.work, ignore_errors=True)

    # ------------------------------------------------------------------ what pods see

    @property
    def http_base(self) -> str:
        return f"http://{testbed.HUB_IP}:{HTTP_PORT}"

    @property
    def slow_base(self) -> str:
        return f"http://{testbed.HUB_IP}:{SLOW_PORT}"

    @property
    def s3_endpoint_for_pods(self) -> str:
        return f"{testbed.HUB_IP}:{S3_PORT}"

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.bed.node_list]

    def add_file(self, path: str, data: bytes) -> str:
        """Serve `data` at `path` on both HTTP servers; its URL as pods see it."""
        target = self.http_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return f"{self.http_base}/{path}"

    def join_node(self) -> str:
        """One more worker node, Ready, for one test: the operator's images only (no KServe
        pod runs there). The test must `leave_node` it before it ends (`reset()` removes one
        left behind): the packages count on the bed's two nodes."""
        refs = {self.images[name] for name in realnodes.OPERATOR_IMAGES}
        return self.bed.join([i for i in self.bed.images if i.ref in refs]).name

    def leave_node(self, name: str) -> None:
        self.bed.leave(name)

    # ------------------------------------------------------------------ reset

    def _items(self, kind: str, *, namespaced: bool = False) -> list[Obj]:
        args = ["get", kind, "-o", "json", *(["-A"] if namespaced else [])]
        done = self.kubectl(*args, check=False)
        if done.returncode != 0:  # e.g. the kind's CRD is not installed
            return []
        items: list[Obj] = json.loads(done.stdout)["items"]
        return items

    def _read_baseline(self) -> Baseline:
        nodes = self._items("nodes")
        return Baseline(
            namespaces=frozenset(n["metadata"]["name"] for n in self._items("namespaces")),
            crds=frozenset(c["metadata"]["name"] for c in self._items("crd")),
            cluster_objects=frozenset(
                (kind, o["metadata"]["name"]) for kind in CLUSTER_KINDS for o in self._items(kind)
            ),
            node_labels={n["metadata"]["name"]: dict(n["metadata"]["labels"]) for n in nodes},
            node_taints={n["metadata"]["name"]: n["spec"].get("taints") or [] for n in nodes},
        )

    def reset(self) -> None:
        """The cluster as the bed started it; see the module docstring."""
        for real in list(self.bed.node_list):
            if real.name not in self.baseline.node_labels:
                self.bed.leave(real.name)  # a node a test joined and did not remove
        for kind in SERVING_KINDS:
            self.kubectl("delete", kind, "--all", "-A", "--wait=false", check=False)
        if not self._release(CACHE_KINDS):
            # no operator answers (or its admission refuses for good): admission off, then
            # the finalizers dropped
            for kind in ADMISSION_KINDS:
                self._delete_new(kind)
            self._drop_finalizers(CACHE_KINDS)
        self._delete_new_namespaces()
        self._drop_finalizers(("localmodelnodes",))  # their agents are gone with the namespaces
        crds = self._new_names("crd")
        if crds:
            self.kubectl("delete", "crd", *crds, "--wait=false", "--ignore-not-found")
        for kind in CLUSTER_KINDS:
            self._delete_new(kind)
        self._wait_gone(
            "every CRD and cluster-scoped object the packages created was deleted",
            lambda: [f"{k}/{n}" for k in ("crd", *CLUSTER_KINDS) for n in self._new_names(k)],
        )
        # what the packages left in namespaces that stay: Helm's release records (an install
        # by another package would otherwise be "still in use") and the Events of cluster-scoped
        # objects (LocalModelNodes are named after the same nodes in every package)
        self.kubectl("delete", "secrets", "-A", "-l", "owner=helm", "--ignore-not-found")
        self.kubectl("delete", "events", "--all", "-n", "default", "--ignore-not-found")
        self._restore_nodes()
        for real in self.bed.node_list:
            for root in (real.models_dir, real.kserve_models_dir):
                _empty(root)
        _empty(self.shared_dir)

    def _release(self, kinds: Sequence[str]) -> bool:
        """Delete every object of `kinds` (again on every poll: admission may refuse while a
        cache still lists a deleted serving object) and wait until its operator released them
        all; False when some are left after `FINALIZER_GRACE_S`."""

        def released() -> bool:
            left = [k for k in kinds if self._items(k, namespaced=True)]
            for kind in left:
                self.kubectl("delete", kind, "--all", "-A", "--wait=false", check=False)
            assert not left, f"not yet released: {left}"
            return True

        try:
            waiting.wait_until_sync(
                released, timeout=FINALIZER_GRACE_S, interval=1.0,
                what="the operator released every cache and node group",
            )  # fmt: skip
        except waiting.WaitTimeout:
            return False
        return True

    def _drop_finalizers(self, kinds: Sequence[str]) -> None:
        for kind in kinds:
            for obj in self._items(kind, namespaced=True):
                meta = obj["metadata"]
                where = ["-n", meta["namespace"]] if meta.get("namespace") else []
                if meta.get("finalizers"):
                    self.kubectl(
                        "patch", kind, meta["name"], *where, "--type=merge",
                        "-p", json.dumps({"metadata": {"finalizers": None}}), check=False,
                    )  # fmt: skip
            self.kubectl("delete", kind, "--all", "-A", "--wait=false", check=False)
        self._wait_gone(
            "the objects whose finalizers were dropped are gone",
            lambda: [f"{k}/{o['metadata']['name']}" for k in kinds
                     for o in self._items(k, namespaced=True)],
        )  # fmt: skip

    def _new_names(self, kind: str) -> list[str]:
        known = self.baseline.crds if kind == "crd" else {
            name for k, name in self.baseline.cluster_objects if k == kind
        }  # fmt: skip
        return sorted(o["metadata"]["name"] for o in self._items(kind)
                      if o["metadata"]["name"] not in known)  # fmt: skip

    def _delete_new(self, kind: str) -> None:
        names = self._new_names(kind)
        if names:
            self.kubectl("delete", kind, *names, "--wait=false", "--ignore-not-found")

    def _delete_new_namespaces(self) -> None:
        """Namespaces without a DaemonSet first, and only then the operator's: a pod that still
        mounts a CSI volume (one that never started, say) is torn down only while the node
        plugin that can unpublish it runs; deleted together, the plugin may go first and the
        pod, and its namespace, stay Terminating for ever."""

        def new() -> list[str]:
            found = (n["metadata"]["name"] for n in self._items("namespaces"))
            return sorted(n for n in found if n not in self.baseline.namespaces)

        hosting = {d["metadata"]["namespace"] for d in self._items("daemonsets", namespaced=True)}
        tenants = [n for n in new() if n not in hosting]
        if tenants:
            self.kubectl("delete", "namespace", *tenants, "--wait=false", "--ignore-not-found")
        self._wait_gone(
            "every namespace the packages created without a DaemonSet was deleted",
            lambda: [n for n in new() if n in tenants],
        )
        names = new()
        if names:
            self.kubectl("delete", "namespace", *names, "--wait=false", "--ignore-not-found")
        self._wait_gone("every namespace the packages created was deleted", new)

    def _wait_gone(self, what: str, left: Callable[[], Sequence[str]]) -> None:
        def gone() -> bool:
            still = left()
            assert not still, f"still there: {list(still)[:10]}"
            return True

        waiting.wait_until_sync(gone, timeout=GONE_TIMEOUT_S, interval=1.0, what=what)

    def _restore_nodes(self) -> None:
        for node in self._items("nodes"):
            name = node["metadata"]["name"]
            want = self.baseline.node_labels.get(name, {})
            labels = node["metadata"].get("labels") or {}
            extra = [f"{k}-" for k in labels if k not in want]
            changed = [f"{k}={v}" for k, v in want.items() if labels.get(k) != v]
            if extra or changed:
                self.kubectl("label", "node", name, "--overwrite", *extra, *changed)
            taints = self.baseline.node_taints.get(name, [])
            if (node["spec"].get("taints") or []) != taints:
                patch = {"spec": {"taints": taints or None}}
                self.kubectl("patch", "node", name, "--type=merge", "-p", json.dumps(patch))
            if node["spec"].get("unschedulable"):
                self.kubectl("uncordon", name)


def _empty(root: Path) -> None:
    """Remove everything inside `root` (a node's models root seen from the host), not `root`
    itself: the node's mount of it stays."""
    if not root.is_dir():
        return
    for child in root.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
