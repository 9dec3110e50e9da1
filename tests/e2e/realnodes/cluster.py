"""What the real-node end-to-end tests need of a cluster: kubectl, waits, node disks, sources.

`Cluster` is the deployed operator on real nodes: the test bed by default, or any cluster
named by `LOCALCACHE_E2E_KUBECONFIG` (then the test servers and node disks the test bed
provides are absent, and the tests that need them say so when they skip).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from localcache.api import groupversion
from localcache.devenv import realnodes
from localcache.devenv.waiting import wait_until_sync
from tests.support import e2ebed

T = TypeVar("T")
Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[3]
SYSTEM_NS = realnodes.SYSTEM_NS
JOBS_NS = "kserve-localmodel-jobs"
CONTROLLER = realnodes.CONTROLLER
AGENT = realnodes.AGENT
LOCALCACHE_IMAGE = realnodes.LOCALCACHE_IMAGE
STORAGE_INITIALIZER_IMAGE = realnodes.STORAGE_INITIALIZER_IMAGE
GROUP_LABEL = "localcache-e2e/group"
CONFIG_MAP = "inferenceservice-config"  # the deployed operator's (manifests/testbed)


def require_real_nodes() -> None:
    """Skip, saying why, where this machine cannot host real nodes; with
    `LOCALCACHE_REQUIRE_REAL_NODES=1` (CI, which can) fail instead."""
    reason = realnodes.unavailable_reason()
    if reason is None:
        return
    if os.environ.get("LOCALCACHE_REQUIRE_REAL_NODES") == "1":
        pytest.fail(f"real nodes are required here (LOCALCACHE_REQUIRE_REAL_NODES=1): {reason}")
    pytest.skip(reason)


@dataclass
class Sources:
    """Model sources that pods reach, and the host-side handles the tests use to fill them."""

    http_base: str  # as pods see it, e.g. http://10.250.0.1:8000
    slow_base: str  # the throttled server, as pods see it
    add_file: Callable[[str, bytes], None]  # (path below both servers' root, content)
    s3_endpoint_for_pods: str | None = None  # host:port; None where no S3 store runs
    s3: Any = None  # tests.support.objectstore.ObjectStore (host-side endpoint)
    http_stats: Callable[[], Any] | None = None  # the HTTP servers' ModelServer.stats()

    def require_s3(self) -> tuple[Any, str]:
        """The store (host-side handle) and its endpoint as pods see it; skips without one."""
        if self.s3 is None or self.s3_endpoint_for_pods is None:
            pytest.skip("the S3 store that enforces credentials runs in the real-node test bed")
        return self.s3, self.s3_endpoint_for_pods

    def private_model(self, bucket: str) -> tuple[str, dict[str, bytes]]:
        """A model in a new bucket of the S3 store (credentials needed): its URI and files."""
        files = {"model.bin": os.urandom(1024 * 1024), "config.json": b'{"arch": "bert"}\n'}
        store, _ = self.require_s3()
        store.create_bucket(bucket)
        for name, data in files.items():
            store.put_object(bucket, f"bert/{name}", data)
        return f"s3://{bucket}/bert", files


@dataclass
class Cluster:
    kubeconfig: Path
    kubectl_bin: str
    node_names: list[str]
    node_models_dir: Callable[[str], Path] | None = None  # host path of a node's /mnt/models
    read_disk: Callable[[str, str], dict[str, str]] | None = None  # (node, rel) -> digests
    sources: Sources | None = None
    shared_dir: Path | None = None  # the bed's ReadWriteMany export (tests.support.sharedvolume)
    cache_dir: Path = field(default_factory=lambda: Path("/tmp"))

    @classmethod
    def on_bed(
        cls,
        shared: e2ebed.SharedBed,
        *,
        package: str,
        kserve_root: bool = False,
        sources: Sources | None = None,
    ) -> Cluster:
        """kubectl on the run's shared test bed for `package`; `node_models_dir` is each
        node's `/mnt/models`, or with `kserve_root` its `/models` (KServe's root)."""
        bed = shared.bed
        plane = bed.control_plane
        assert plane.kubectl_path is not None

        def models_dir(name: str) -> Path:
            real = bed.node(name)
            return real.kserve_models_dir if kserve_root else real.models_dir

        return cls(
            kubeconfig=plane.kubeconfig_path,
            kubectl_bin=plane.kubectl_path,
            node_names=shared.node_names,
            node_models_dir=models_dir,
            sources=sources,
            shared_dir=shared.shared_dir,
            cache_dir=Path(tempfile.mkdtemp(prefix=f"localcache-{package}-", dir=shared.work)),
        )

    # ---------------------------------------------------------------------- kubectl

    def kubectl_bytes(self, *args: str, data: bytes, timeout: float = 120) -> None:
        """kubectl with binary standard input (e.g. `exec -i` writing a file)."""
        done = self._run(list(args), data, timeout)
        if done.returncode != 0:
            raise AssertionError(f"kubectl {args[0]} failed: {done.stderr!r}")

    def kubectl(
        self, *args: str, check: bool = True, input_text: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        done = self._run(list(args), input_text, timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def _run(self, args: list[str], stdin: Any, timeout: float) -> subprocess.CompletedProcess[Any]:
        return subprocess.run(
            [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=not isinstance(stdin, bytes),
            input=stdin,
            timeout=timeout,
            env={**os.environ, "KUBECACHEDIR": str(self.cache_dir / "kube-cache")},
            check=False,
        )

    def report(self, commands: list[tuple[str, ...]], *, tail: int | None = None) -> str:
        """Each kubectl command with what it printed (the last `tail` characters of stdout),
        for a failure report; a command that fails says so in its own part."""
        parts = []
        for args in commands:
            done = self.kubectl(*args, check=False)
            out = done.stdout if tail is None else done.stdout[-tail:]
            parts.append(f"$ kubectl {' '.join(args)}\n{out}{done.stderr}")
        return "\n".join(parts)

    # JSON, not YAML: PyYAML (YAML 1.1) leaves strings such as "08" or "1e5" unquoted, which
    # kubectl's YAML reader takes for numbers (a random label value "08..." failed a test)
    def apply(self, *objs: Obj) -> None:
        listed = {"apiVersion": "v1", "kind": "List", "items": list(objs)}
        self.kubectl("apply", "-f", "-", input_text=json.dumps(listed))

    def create(self, obj: Obj, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.kubectl("create", "-f", "-", input_text=json.dumps(obj), check=check)

    @contextlib.contextmanager
    def local_model(self, **changes: object) -> Iterator[None]:
        """`localModel` keys changed in the deployed ConfigMap, then restored."""
        config = self.get("configmap", CONFIG_MAP, namespace=SYSTEM_NS)
        assert config is not None
        before = config["data"]["localModel"]

        def write(local_model: str) -> None:
            patch = {"data": {"localModel": local_model}}
            self.kubectl("patch", "configmap", CONFIG_MAP, "-n", SYSTEM_NS, "--type=merge",
                         "-p", json.dumps(patch))  # fmt: skip

        write(json.dumps({**json.loads(before), **changes}))
        try:
            yield
        finally:
            write(before)

    def get(self, kind: str, name: str = "", *, namespace: str | None = None) -> Obj | None:
        args = ["get", kind, *([name] if name else []), "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        done = self.kubectl(*args, check=False)
        if done.returncode != 0:
            if "NotFound" in done.stderr or "not found" in done.stderr:
                return None
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        found: Obj = json.loads(done.stdout)
        return found

    def items(self, kind: str, *, namespace: str | None = None, selector: str = "") -> list[Obj]:
        args = ["get", kind, "-o", "json"]
        args += ["-n", namespace] if namespace else ["-A"]
        if selector:
            args += ["-l", selector]
        listed: list[Obj] = json.loads(self.kubectl(*args).stdout)["items"]
        return listed

    def namespace(self, prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:5]}"
        self.kubectl("create", "namespace", name)
        return name

    def tenant(self, namespace: str) -> str:
        """A user with the built-in `edit` role in `namespace` only (plus InferenceServices,
        whose CRD aggregates into no role): a tenant with ordinary rights, for `--as`."""
        user = f"tenant-{namespace}"
        self.kubectl(
            "create", "rolebinding", "tenant-edit", "-n", namespace, "--clusterrole=edit",
            f"--user={user}",
        )  # fmt: skip
        self.kubectl(
            "create", "role", "isvc", "-n", namespace, "--verb=create,get,list",
            f"--resource=inferenceservices.{groupversion.INFERENCE_SERVICE.group}",
        )  # fmt: skip
        self.kubectl(
            "create", "rolebinding", "isvc", "-n", namespace, "--role=isvc", f"--user={user}"
        )
        return user

    def wait(self, predicate: Callable[[], T | None], *, timeout: float, what: str) -> T:
        found = wait_until_sync(predicate, timeout=timeout, interval=0.5, what=what)
        assert found is not None
        return found

    # ------------------------------------------------------------------ localcache

    def condition(self, obj: Obj | None, kind: str) -> Obj | None:
        for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
            if cond.get("type") == kind:
                found: Obj = cond
                return found
        return None

    def wait_ready(
        self, kind: str, name: str, *, namespace: str | None = None, timeout: float = 120
    ) -> Obj:
        def ready() -> Obj | None:
            obj = self.get(kind, name, namespace=namespace)
            cond = self.condition(obj, "Ready")
            return obj if cond and cond.get("status") == "True" else None

        where = f" in {namespace}" if namespace else ""
        found = self.wait(ready, timeout=timeout, what=f"{kind} {name}{where} becomes Ready")
        assert found is not None
        return found

    def wait_bound(self, claim: str, *, namespace: str, timeout: float = 120) -> None:
        """Wait until the PersistentVolumeClaim `namespace/claim` is Bound."""

        def bound() -> bool:
            pvc = self.get("pvc", claim, namespace=namespace) or {}
            return (pvc.get("status") or {}).get("phase") == "Bound"

        self.wait(
            bound, timeout=timeout, what=f"PersistentVolumeClaim {namespace}/{claim} is Bound"
        )

    def node_status(self, node: str) -> Obj:
        lmn = self.get(groupversion.LOCAL_MODEL_NODE.plural, node) or {}
        status: Obj = (lmn.get("status") or {}).get("modelStatus") or {}
        return status

    def node_group(self, name: str, *, selector: dict[str, str] | None = None) -> Obj:
        """A node group over the nodes with `selector` (default: every worker), models at
        the nodes' /mnt/models, the agent's models root."""
        selector = selector or {"kserve/localmodel": "worker"}
        terms = [{"key": k, "operator": "In", "values": [v]} for k, v in selector.items()]
        return {
            "apiVersion": groupversion.LOCAL_MODEL_NODE_GROUP.api_version,
            "kind": groupversion.LOCAL_MODEL_NODE_GROUP.kind,
            "metadata": {"name": name},
            "spec": {
                "storageLimit": "10Gi",
                "persistentVolumeSpec": {
                    "accessModes": ["ReadWriteOnce"],
                    "volumeMode": "Filesystem",
                    "capacity": {"storage": "10Gi"},
                    "local": {"path": "/mnt/models"},
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "localcache-local",
                    "nodeAffinity": {
                        "required": {"nodeSelectorTerms": [{"matchExpressions": terms}]}
                    },
                },
                "persistentVolumeClaimSpec": {
                    "accessModes": ["ReadWriteOnce"],
                    "volumeMode": "Filesystem",
                    "resources": {"requests": {"storage": "10Gi"}},
                    "storageClassName": "localcache-local",
                },
            },
        }

    # ------------------------------------------------------------------ node disks

    def model_files(self, node: str, storage_key: str) -> dict[str, str]:
        """sha256 of every file in `models/<storage_key>` on `node`'s disk, by relative path
        (empty when the folder is absent)."""
        if self.node_models_dir is not None:
            return tree_digests(self.node_models_dir(node) / "models" / storage_key)
        if self.read_disk is None:
            pytest.skip("no way to read this cluster's node disks")
        return self.read_disk(node, f"models/{storage_key}")

    def models_root(self, node: str) -> Path:
        """The node's models root on this machine: only the test bed has one."""
        if self.node_models_dir is None:
            pytest.skip("watching a node's disk continuously needs the real-node test bed")
        return self.node_models_dir(node)


def tree_digests(folder: Path) -> dict[str, str]:
    """sha256 of every regular file below `folder`, keyed by relative path (empty if absent)."""
    found: dict[str, str] = {}
    if not folder.is_dir():
        return found
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found
