"""Zero-trust tenancy on real pods: what a tenant's objects and a node's files may and may not
do once localcache is deployed from the shipped manifests (README "Security model").

- A tenant pod that mounts a localcache PVC without its cache's subPath, or read-write, is
  denied by the admission policies, saying why; the pod KServe would create is admitted.
- A tenant that replaces its download Job with a forged one (same name and labels, completing)
  does not get `ModelDownloaded` on another tenant's private folder.
- An agent's token (bound to its pod, so carrying its node's name) cannot create a Job in a
  namespace without a namespace cache (nor in kube-system), nor write another node's
  LocalModelNode status; it can write its own. Nor a Job owned by and pinned to its own node
  in the job namespace that is privileged, hostPID or mounts the node's / (findings 7, 14b).
- Promoted folders are 0755 and their files 0644, though the storage initializer image runs as
  uid 1000; deleting the cache removes every byte, also from `.trash`.
- A download that leaves a FIFO is promoted without it; a `.trash` replaced by a symlink to
  `models` is repaired and reported, and deletes nothing but what it should.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcache.agent.disk import layout
from localcache.api import groupversion
from localcache.api import inferenceservice as isvc_api
from localcache.caching import keys
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import (
    AGENT,
    JOBS_NS,
    LOCALCACHE_IMAGE,
    SYSTEM_NS,
    Cluster,
    Sources,
)
from tests.e2e.realnodes.objects import LMC, LMNC

Obj = dict[str, Any]
ISVC = groupversion.INFERENCE_SERVICE
LMN = groupversion.LOCAL_MODEL_NODE

pytestmark = pytest.mark.timeout(300)


def _archive(files: dict[str, bytes]) -> bytes:
    """A .tar.gz the storage initializer unpacks, so it creates sub-directories itself."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o777  # the modes a hostile archive asks for are not kept
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _modes(folder: Path) -> dict[str, str]:
    """Permission bits of everything below `folder` (and of the folder, as '.'), in octal."""
    found = {".": oct(stat.S_IMODE(folder.lstat().st_mode))}
    for path in sorted(folder.rglob("*")):
        found[str(path.relative_to(folder))] = oct(stat.S_IMODE(path.lstat().st_mode))
    return found


def test_promoted_folders_are_0755_with_0644_files_and_deleting_the_cache_removes_every_byte(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    files = {"config.json": b'{"arch": "t5"}\n', "weights/part-0.bin": os.urandom(128 * 1024)}
    sources.add_file(f"modes-{run}/model.tar.gz", _archive(files))
    uri = f"{sources.http_base}/modes-{run}/model.tar.gz"
    key = keys.storage_key(uri)
    group, name = f"g-{run}", f"modes-{run}"
    node = cluster.node_names[0]
    root = cluster.models_root(node)
    cluster.apply(cluster.node_group(group), objects.cache(name, uri, group))
    try:
        cluster.wait_ready(LMC.plural, name, timeout=180)
        folder = root / "models" / key
        assert cluster.model_files(node, key) == {
            path: hashlib.sha256(data).hexdigest() for path, data in files.items()
        }
        owners = {path.lstat().st_uid for path in folder.rglob("*")}
        assert owners, f"nothing below {folder}"
        modes = _modes(folder)
        want = {
            path: "0o755" if (folder / path).is_dir() or path == "." else "0o644" for path in modes
        }
        assert modes == want, f"modes below {folder} (owners {owners})"
    finally:
        cluster.kubectl("delete", LMC.plural, name, "--wait=true", "--timeout=90s")

    def gone() -> bool:
        trash = root / ".trash"
        on_disk = (root / "models" / key).exists() or any(trash.iterdir())
        return not on_disk and name not in cluster.node_status(node)

    # The agent removes the folder before its next status write drops the entry: wait for both.
    cluster.wait(
        gone,
        timeout=90,
        what=f"{node} deletes models/{key}, empties .trash and drops {name} from its status",
    )


# ---------------------------------------------------------------------------- tenant pods


def _serving_claim(cluster: Cluster, namespace: str, cache: str, uri: str) -> str:
    """The serving PVC the webhook names for an InferenceService of `uri` in `namespace`."""
    cluster.create(
        {
            "apiVersion": ISVC.api_version,
            "kind": ISVC.kind,
            "metadata": {"name": "classifier", "namespace": namespace},
            "spec": {"predictor": {"model": {"modelFormat": {"name": "onnx"}, "storageUri": uri}}},
        }
    )
    meta = (cluster.get(ISVC.plural, "classifier", namespace=namespace) or {})["metadata"]
    assert meta.get("labels", {}).get(isvc_api.LOCAL_MODEL_LABEL) == cache, meta
    claim: str = meta["annotations"][isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION]

    def bound() -> bool:
        found = cluster.get("pvc", claim, namespace=namespace) or {}
        return bool(found.get("status", {}).get("phase") == "Bound")

    cluster.wait(
        bound,
        timeout=60,
        what=f"serving PVC {namespace}/{claim} is Bound",
    )
    return claim


def _dry_run_create(cluster: Cluster, obj: Obj) -> tuple[bool, str]:
    done = cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input_text=yaml.safe_dump(obj), check=False
    )
    return done.returncode == 0, done.stderr.strip()


def test_tenant_pods_reach_a_localcache_claim_only_read_only_at_their_caches_subpath(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    sources.add_file(f"tenant-{run}/model.onnx", os.urandom(32 * 1024))
    uri = f"{sources.http_base}/tenant-{run}/model.onnx"
    namespace = cluster.namespace("tenant-pods")
    group = f"g-{run}"
    cluster.apply(cluster.node_group(group), objects.cache("onnx", uri, group, namespace=namespace))
    cluster.wait_ready(LMNC.plural, "onnx", namespace=namespace, timeout=180)
    claim = _serving_claim(cluster, namespace, "onnx", uri)
    node = cluster.node_names[0]
    sub_path = layout.model_subpath(keys.storage_key(uri))

    def pod(**mount: Any) -> Obj:
        obj = objects.digest_pod("reader", namespace, claim=claim, sub_path=sub_path, node=node)
        obj["spec"]["containers"][0]["volumeMounts"][0].update(mount)
        return obj

    admitted, why = _dry_run_create(cluster, pod())
    assert admitted, f"the pod KServe would create was denied: {why}"
    whole_root = pod()
    del whole_root["spec"]["containers"][0]["volumeMounts"][0]["subPath"]
    for what, obj in {
        "without a subPath": whole_root,
        "read-write": pod(readOnly=False),
        "at another folder of the root": pod(subPath=layout.TRASH_DIR),
    }.items():
        admitted, why = _dry_run_create(cluster, obj)
        assert not admitted, f"a tenant pod mounting {claim} {what} was admitted"
        assert "denied" in why, why
        assert "subPath" in why or "read" in why, f"the denial does not say why: {why}"


# --------------------------------------------------------------------------- forged Jobs


def _forged_job(original: Obj) -> Obj:
    """A Job with `original`'s name, namespace and labels that completes at once, doing
    nothing: what a tenant who may create Jobs in its namespace can make."""
    meta = original["metadata"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": meta.get("labels") or {},
            "annotations": meta.get("annotations") or {},
            "ownerReferences": meta.get("ownerReferences") or [],
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                    "containers": [
                        {
                            "name": "forged",
                            "image": LOCALCACHE_IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["python3", "-c", "pass"],
                        }
                    ],
                }
            },
        },
    }


def _job_done(job: Obj | None) -> bool:
    conditions = ((job or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Complete" and c.get("status") == "True" for c in conditions)


def test_a_tenant_that_replaces_its_download_job_does_not_get_model_downloaded(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    uri, _ = sources.private_model(f"forge-{run}")
    key = keys.storage_key(uri)
    store, endpoint = sources.require_s3()
    node = cluster.node_names[0]
    group = f"g-{run}"
    cluster.apply(cluster.node_group(group))

    owner = cluster.namespace("owner")
    key_id, secret = store.create_user(f"owner-{run}")
    cluster.apply(
        *objects.s3_credentials(
            owner, name="s3-reader", endpoint=endpoint, key_id=key_id, secret=secret
        ),
        objects.cache("bert", uri, group, namespace=owner, service_account="s3-reader"),
    )
    cluster.wait_ready(LMNC.plural, "bert", namespace=owner, timeout=180)

    forger = cluster.namespace("forger")
    cluster.apply(
        *objects.s3_credentials(
            forger,
            name="s3-reader",
            endpoint=endpoint,
            key_id="AKIAFORGERFORGER0000",
            secret="not-a-valid-secret",
        ),
        objects.cache("bert", uri, group, namespace=forger, service_account="s3-reader"),
    )
    forged_key = keys.status_key("bert", forger)

    def never_downloaded() -> None:
        assert cluster.node_status(node).get(forged_key) != "ModelDownloaded", (
            f"the forger's entry is ModelDownloaded on {node} without valid credentials"
        )

    def agent_job() -> Obj | None:
        never_downloaded()
        found = cluster.items("jobs", namespace=forger, selector=f"storageKey={key},node={node}")
        return found[0] if found else None

    original = cluster.wait(agent_job, timeout=120, what=f"the agent's download Job in {forger}")
    name = original["metadata"]["name"]
    cluster.kubectl("delete", "job", "-n", forger, name, "--wait=true", "--timeout=60s")
    cluster.create(_forged_job(original))

    def forged_done() -> bool:
        never_downloaded()
        return _job_done(cluster.get("job", name, namespace=forger))

    cluster.wait(
        forged_done,
        timeout=120,
        what=f"the forged Job {forger}/{name} completes",
    )

    def reported() -> bool:
        never_downloaded()
        events = cluster.items("events", namespace="default")
        return any(
            e.get("reason") == "UntrustedDownloadJob" and name in e.get("message", "")
            for e in events
        )

    cluster.wait(reported, timeout=60, what=f"an UntrustedDownloadJob Event naming {name}")

    # A later status write of the same agent (another cache of the forger's namespace on the
    # node becoming downloaded) still does not count the forged Job.
    sources.add_file(f"forge-{run}/after.bin", b"after")
    after = f"{sources.http_base}/forge-{run}/after.bin"
    cluster.apply(objects.cache("after", after, group, namespace=forger))

    def after_downloaded() -> bool:
        never_downloaded()
        return cluster.node_status(node).get(keys.status_key("after", forger)) == "ModelDownloaded"

    cluster.wait(
        after_downloaded,
        timeout=180,
        what=f"the forger's second cache is downloaded on {node}",
    )
    never_downloaded()
    assert cluster.get("job", name, namespace=forger) is not None, "the forged Job was deleted"


# ------------------------------------------------------------------------------ agent token


def _token_kubeconfig(cluster: Cluster, token: str) -> Path:
    raw = json.loads(cluster.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    cluster_entry = raw["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster_entry}],
        "users": [{"name": "agent", "user": {"token": token}}],
        "contexts": [{"name": "agent", "context": {"cluster": "c", "user": "agent"}}],
        "current-context": "agent",
    }
    path = cluster.cache_dir / f"agent-{uuid.uuid4().hex[:6]}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _agent_pod(cluster: Cluster, node: str) -> Obj:
    pods = cluster.items("pods", namespace=SYSTEM_NS, selector="app.kubernetes.io/component=agent")
    for found in pods:
        if found["spec"].get("nodeName") == node:
            return found
    raise AssertionError(f"no agent pod on {node}")


def test_an_agent_token_is_confined_to_its_own_node_and_to_namespaces_with_a_cache(
    cluster: Cluster,
) -> None:
    own, other = cluster.node_names[0], cluster.node_names[1]
    pod = _agent_pod(cluster, own)
    token = cluster.kubectl(
        "create",
        "token",
        pod["spec"]["serviceAccountName"],
        "-n",
        SYSTEM_NS,
        "--bound-object-kind=Pod",
        f"--bound-object-name={pod['metadata']['name']}",
        f"--bound-object-uid={pod['metadata']['uid']}",
        "--duration=10m",
    ).stdout.strip()
    as_agent = Cluster(
        kubeconfig=_token_kubeconfig(cluster, token),
        kubectl_bin=cluster.kubectl_bin,
        node_names=cluster.node_names,
        cache_dir=cluster.cache_dir,
    )
    assert AGENT in pod["spec"]["serviceAccountName"]

    def status_patch(node: str) -> subprocess.CompletedProcess[str]:
        patch = {"status": {"modelStatus": {"probe-from-test": "ModelDownloaded"}}}
        return as_agent.kubectl(
            "patch", LMN.plural, node, "--subresource=status", "--type=merge",
            "-p", json.dumps(patch), "--dry-run=server", check=False,
        )  # fmt: skip

    mine = status_patch(own)
    assert mine.returncode == 0, f"the agent may not write its own node's status: {mine.stderr}"
    theirs = status_patch(other)
    assert theirs.returncode != 0, f"node {own}'s agent token wrote node {other}'s status"
    assert "denied" in theirs.stderr or "forbidden" in theirs.stderr.lower(), theirs.stderr

    lmn = cluster.get(LMN.plural, own) or {}
    uncached = cluster.namespace("no-cache")
    for namespace in (uncached, "kube-system"):
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"lmd-probe-{uuid.uuid4().hex[:6]}",
                "namespace": namespace,
                "ownerReferences": [
                    {
                        "apiVersion": LMN.api_version,
                        "kind": LMN.kind,
                        "name": own,
                        "uid": lmn["metadata"]["uid"],
                    }
                ],
            },
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": {"kubernetes.io/hostname": own},
                        "containers": [
                            {"name": "c", "image": LOCALCACHE_IMAGE, "command": ["true"]}
                        ],
                    }
                }
            },
        }
        done = as_agent.kubectl(
            "create", "--dry-run=server", "-f", "-", input_text=yaml.safe_dump(job), check=False
        )
        assert done.returncode != 0, f"the agent's token created a Job in {namespace}"
        assert "denied" in done.stderr or "forbidden" in done.stderr.lower(), done.stderr

    # findings 7 and 14b: in the job namespace, owned by and pinned to its own node, the Job
    # that ran as root with the node's filesystem and process table is refused, not dry-run
    root = _node_root_job(own, lmn["metadata"]["uid"])
    done = as_agent.kubectl("create", "-f", "-", input_text=yaml.safe_dump(root), check=False)
    assert done.returncode != 0, "the agent's token created a privileged hostPath Job"
    assert "localcache-agent-node" in done.stderr, done.stderr
    assert cluster.get("job", root["metadata"]["name"], namespace=JOBS_NS) is None


def _node_root_job(node: str, lmn_uid: str) -> Obj:
    """What a stolen agent token tried in the review: download-shaped by owner, pin and name,
    but privileged, hostPID and hostNetwork, as root, with the node's / mounted."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"lmd-not-a-download-{uuid.uuid4().hex[:6]}",
            "namespace": JOBS_NS,
            "labels": {"storageKey": "0123456789abcdef"},
            "ownerReferences": [
                {"apiVersion": LMN.api_version, "kind": LMN.kind, "name": node, "uid": lmn_uid}
            ],
        },
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "hostPID": True,
                    "hostNetwork": True,
                    "containers": [
                        {
                            "name": "c",
                            "image": LOCALCACHE_IMAGE,
                            "command": ["ls", "/host/var/lib/kubelet/pods"],
                            "securityContext": {"privileged": True, "runAsUser": 0},
                            "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                        }
                    ],
                    "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
                }
            }
        },
    }


# ------------------------------------------------------------------- hostile node files


def _fifo_downloader(name: str, prefix: str) -> Obj:
    """A ClusterStorageContainer whose download writes the model and a FIFO beside it."""
    script = (
        "import os, sys\n"
        "dest = sys.argv[2]\n"
        "open(os.path.join(dest, 'model.bin'), 'wb').write(b'weights')\n"
        "os.mkfifo(os.path.join(dest, 'pipe'))\n"
    )
    csc = objects.localcache_downloader(name, prefix)
    csc["spec"]["container"]["command"] = ["python3", "-c", script]
    return csc


def test_a_fifo_or_a_symlinked_trash_leaves_the_agent_working_and_the_models_intact(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    node = cluster.node_names[0]
    root = cluster.models_root(node)
    group = f"g-{run}"
    prefix = f"http://fifo-{run}.invalid/"
    fifo_uri = prefix + "model"
    sources.add_file(f"plain-{run}/model.bin", b"plain")
    plain_uri = f"{sources.http_base}/plain-{run}/model.bin"
    cluster.apply(
        _fifo_downloader(f"fifo-{run}", prefix),
        cluster.node_group(group),
        objects.cache(f"fifo-{run}", fifo_uri, group),
        objects.cache(f"plain-{run}", plain_uri, group),
    )
    aside = root / f".trash-aside-{run}"
    try:
        cluster.wait_ready(LMC.plural, f"fifo-{run}", timeout=180)
        cluster.wait_ready(LMC.plural, f"plain-{run}", timeout=180)
        fifo_folder = root / "models" / keys.storage_key(fifo_uri)
        assert (fifo_folder / "model.bin").read_bytes() == b"weights"
        assert not (fifo_folder / "pipe").exists(), "the FIFO was promoted"
        kept = cluster.model_files(node, keys.storage_key(fifo_uri))

        trash = root / layout.TRASH_DIR
        trash.rename(aside)
        trash.symlink_to(root / "models")
        cluster.kubectl("delete", LMC.plural, f"plain-{run}", "--wait=true", "--timeout=90s")

        def repaired() -> bool:
            events = cluster.items("events", namespace="default")
            return (
                any(
                    e.get("reason") == "ModelsRootRepaired"
                    and e["involvedObject"].get("name") == node
                    and layout.TRASH_DIR in e.get("message", "")
                    for e in events
                )
                and not (root / "models" / keys.storage_key(plain_uri)).exists()
            )

        cluster.wait(repaired, timeout=90, what=f"{node} repairs .trash and deletes plain-{run}")
        assert trash.is_dir()
        assert not trash.is_symlink()
        assert cluster.model_files(node, keys.storage_key(fifo_uri)) == kept
        assert cluster.node_status(node).get(f"fifo-{run}") == "ModelDownloaded"
    finally:
        cluster.kubectl("delete", LMC.plural, f"fifo-{run}", f"plain-{run}", "--ignore-not-found")
        cluster.kubectl("delete", "clusterstoragecontainer", f"fifo-{run}", "--ignore-not-found")
