"""The data-plane benchmark's own real-node test bed: nodes, the capped origin, the operator.

`BenchBed(nodes=N, shape=...)` starts a `devenv.testbed.TestBed` of N nodes (its own
namespaces, cgroups and run directory, like the tests' beds; never the shared e2e bed) with
the operator's images, the S3 store (`tests.support.objectstore`, moto, credentials enforced)
in the hub namespace on `S3_PORT`, the shipped manifests deployed (`realnodes.deploy`), and
the links shaped (`shaping`: origin total egress at `shape.origin_rate`, each node's link at
`shape.link_rate` both ways). `stop()` removes all of it; always call it.

What a run needs of it: `upload_model` (a bucket prefix of `files` random files, `size`
bytes in all; returns its `s3://` URI), `tenant` (a namespace whose ServiceAccount's Secret
holds keys the store accepts), `set_members` / `node_group` (which nodes a node group holds,
and its `spec.peerDistribution.enabled`), the counters (`origin_link_bytes`,
`origin_server_bytes`, `cpu_folders`, `agent_uids`), `model_files` (what a node's disk holds
under `models/<storage key>`) and `kubectl`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.dataplane import shaping
from localcache.api import groupversion
from localcache.devenv import nodeassets, realnodes, testbed
from tests.support import objectstore

Obj = dict[str, Any]
S3_PORT = 9000
MEMBER_LABEL = "localcache-bench/member"
SERVICE_ACCOUNT = "s3-reader"
AGENT_SELECTOR = "app.kubernetes.io/component=agent"


@dataclass(frozen=True)
class Shape:
    """Bytes per second: the origin's total egress, and each node's link (each way)."""

    origin_rate: int
    link_rate: int


class BenchBed:
    """See the module docstring."""

    def __init__(self, *, nodes: int, shape: Shape) -> None:
        self.nodes = nodes
        self.shape = shape
        self.work = Path(tempfile.mkdtemp(prefix="localcache-bench-"))
        self.bed: testbed.TestBed | None = None
        self.store: objectstore.ObjectStore | None = None

    # ------------------------------------------------------------------ life cycle

    def start(self) -> BenchBed:
        try:
            images = _images(realnodes.OPERATOR_IMAGES)
            self.bed = testbed.TestBed(nodes=self.nodes, images=images)
            self.bed.start()
            (reach,) = self.bed.forward([S3_PORT])
            self.store = objectstore.ObjectStore(log_path=self.work / "s3.log")
            self.store.start(
                self.bed.hub.prefix(), testbed.HUB_IP, S3_PORT, reach=f"http://127.0.0.1:{reach}"
            )
            plane = self.bed.control_plane
            assert plane.kubectl_path is not None
            self.kubectl_bin = plane.kubectl_path
            self.kubeconfig = plane.kubeconfig_path
            self.kubectl = realnodes.kubectl_runner(self.kubectl_bin, self.kubeconfig, self.work)
            realnodes.deploy(self.kubectl)
            self._shape()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.store is not None:
            self.store.stop()
            self.store = None
        if self.bed is not None:
            self.bed.stop()
            self.bed = None
        shutil.rmtree(self.work, ignore_errors=True)

    def _bed(self) -> testbed.TestBed:
        if self.bed is None:
            raise RuntimeError("the bench bed is not started")
        return self.bed

    def _shape(self) -> None:
        bed = self._bed()
        shaping.apply(
            bed.hub.run,
            shaping.origin_commands(testbed.BRIDGE, port=S3_PORT, rate=self.shape.origin_rate),
        )
        for real in bed.node_list:
            veth = f"veth{real.addresses.index}"  # the hub side of the node's link
            shaping.apply(bed.hub.run, shaping.link_commands(veth, rate=self.shape.link_rate))
            shaping.apply(real.anchor.run, shaping.link_commands("eth0", rate=self.shape.link_rate))

    # ------------------------------------------------------------------ what a run uses

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self._bed().node_list]

    @property
    def kubectl_env(self) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "KUBECACHEDIR": str(self.work / "kube-cache")}

    def upload_model(self, bucket: str, prefix: str, *, files: int, size: int) -> str:
        """`files` files of random bytes, `size` in all, under s3://bucket/prefix."""
        assert self.store is not None
        self.store.create_bucket(bucket)
        each, extra = divmod(size, files)
        for i in range(files):
            data = os.urandom(each + (extra if i == files - 1 else 0))
            self.store.put_object(bucket, f"{prefix}/part-{i:02d}.bin", data)
        return f"s3://{bucket}/{prefix}"

    def tenant(self, namespace: str) -> None:
        """`namespace` with ServiceAccount SERVICE_ACCOUNT whose Secret the store accepts."""
        assert self.store is not None
        key_id, secret = self.store.create_user(f"bench-{namespace}")
        self.kubectl("create", "namespace", namespace)
        secret_obj: Obj = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": SERVICE_ACCOUNT,
                "namespace": namespace,
                "annotations": {
                    "serving.kserve.io/s3-endpoint": f"{testbed.HUB_IP}:{S3_PORT}",
                    "serving.kserve.io/s3-usehttps": "0",
                    "serving.kserve.io/s3-region": objectstore.REGION,
                },
            },
            "type": "Opaque",
            "stringData": {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret},
        }
        account: Obj = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": namespace},
            "secrets": [{"name": SERVICE_ACCOUNT}],
        }
        self.apply(secret_obj, account)

    def apply(self, *objs: Obj) -> None:
        listed = {"apiVersion": "v1", "kind": "List", "items": list(objs)}
        realnodes.apply_once_admitted(self.kubectl, json.dumps(listed))

    def set_members(self, members: list[str]) -> None:
        """Label `members` into the benchmark's node groups, and no other node."""
        for name in self.node_names:
            if name in members:
                self.kubectl("label", "node", name, "--overwrite", f"{MEMBER_LABEL}=yes")
            else:  # removing a label a node does not have is not an error here
                self.kubectl("label", "node", name, f"{MEMBER_LABEL}-", check=False)

    def set_peer(self, group: str, enabled: bool) -> None:
        patch = {"spec": {"peerDistribution": {"enabled": enabled}}}
        self.kubectl(
            "patch", groupversion.LOCAL_MODEL_NODE_GROUP.plural, group, "--type=merge",
            "-p", json.dumps(patch),
        )  # fmt: skip

    def origin_link_bytes(self) -> int:
        done = self._bed().hub.run(["tc", "-s", "class", "show", "dev", testbed.BRIDGE])
        return shaping.class_bytes(done.stdout, shaping.ORIGIN_CLASS)

    def origin_server_bytes(self) -> int | None:
        assert self.store is not None
        try:
            return self.store.bytes_sent()[1]
        except (OSError, objectstore.ObjectStoreError, KeyError, ValueError):
            return None

    def cpu_folders(self) -> dict[str, Path]:
        """Each node's cgroup folder that has a CPU counter (cpuacct v1, or v2)."""
        bed = self._bed()
        found: dict[str, Path] = {}
        for real in bed.node_list:
            for hierarchy in bed.cgroups.hierarchies:
                folder = hierarchy.mount / bed.cgroups.path(real.name).lstrip("/")
                if (folder / "cpuacct.usage").is_file() or (folder / "cpu.stat").is_file():
                    found[real.name] = folder
                    break
        return found

    def agent_uids(self) -> set[str]:
        done = self.kubectl(
            "get", "pods", "-n", realnodes.SYSTEM_NS, "-l", AGENT_SELECTOR, "-o", "json"
        )
        return {p["metadata"]["uid"] for p in json.loads(done.stdout)["items"]}

    def diagnose(self) -> str:
        """What an operator would look at when a run fails: node statuses, Jobs, pods, the
        agents' last log lines (best effort: every command's failure is part of the text)."""
        if self.bed is None:
            return "(no bed)"
        parts = []
        for args in (
            ("get", "lmn", "-o", "yaml"),
            ("get", "jobs,pods", "-A", "-o", "wide"),
            ("get", "events", "-A", "--field-selector", "type=Warning"),
            ("logs", "-n", realnodes.SYSTEM_NS, "-l", AGENT_SELECTOR, "--tail=20", "--prefix"),
        ):
            done = self.kubectl(*args, check=False)
            parts.append(f"$ kubectl {' '.join(args)}\n{done.stdout[-6000:]}{done.stderr[-2000:]}")
        return "\n".join(parts)

    def model_files(self, node: str, storage_key: str) -> dict[str, int]:
        """Size of every regular file below `models/<storage_key>` on `node`'s disk."""
        folder = self._bed().node(node).models_dir / "models" / storage_key
        if not folder.is_dir():
            return {}
        return {
            str(p.relative_to(folder)): p.stat().st_size
            for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()
        }


def _images(names: tuple[str, ...]) -> list[testbed.Image]:
    """Build (or reuse) the node binaries and only the images `names` (not every image of
    the e2e packages, as `realnodes.prepare_images` would)."""
    if nodeassets.missing_assets() is not None:
        realnodes.hack("build-node.sh")
    built = json.loads(Path(realnodes.hack("build-images.sh", *names)).read_text())
    return [
        testbed.Image(
            ref=built[name]["ref"],
            tarball=Path(built[name]["tar"]),
            aliases=realnodes.IMAGE_ALIASES.get(name, ()),
        )
        for name in names
    ]


def node_group(name: str, *, peer: bool) -> Obj:
    """A node group over the nodes labelled MEMBER_LABEL=yes, models at /mnt/models."""
    terms = [
        {"key": "kserve/localmodel", "operator": "In", "values": ["worker"]},
        {"key": MEMBER_LABEL, "operator": "In", "values": ["yes"]},
    ]
    return {
        "apiVersion": groupversion.LOCAL_MODEL_NODE_GROUP.api_version,
        "kind": groupversion.LOCAL_MODEL_NODE_GROUP.kind,
        "metadata": {"name": name},
        "spec": {
            "storageLimit": "10Gi",
            "peerDistribution": {"enabled": peer},
            "persistentVolumeSpec": {
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Filesystem",
                "capacity": {"storage": "10Gi"},
                "local": {"path": "/mnt/models"},
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "localcache-local",
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": terms}]}},
            },
            "persistentVolumeClaimSpec": {
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Filesystem",
                "resources": {"requests": {"storage": "10Gi"}},
                "storageClassName": "localcache-local",
            },
        },
    }


def namespace_cache(name: str, uri: str, *, namespace: str, group: str, size: int) -> Obj:
    """A LocalModelNamespaceCache of `uri` on `group`, read with SERVICE_ACCOUNT's keys."""
    kind = groupversion.LOCAL_MODEL_NAMESPACE_CACHE
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "sourceModelUri": uri,
            "modelSize": f"{size * 2 // 2**20 + 1}Mi",
            "nodeGroups": [group],
            "serviceAccountName": SERVICE_ACCOUNT,
        },
    }
