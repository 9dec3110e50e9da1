"""Install, uninstall and reinstall each profile with kustomize and with Helm on a real
control plane of its own (with kube-controller-manager, so namespaces finish deleting),
beside KServe-like objects: namespace `kserve`, KServe's `inferenceservice-config` carrying a
user's `s3Endpoint`, KServe's CRDs (the stand-ins of manifests/test) and the four localmodel
CRDs as KServe ships them (stand-in: our own manifests/crds; KServe's exact YAML is not
available offline).

- with-kserve leaves KServe's ConfigMap, CRDs and namespace byte-for-byte unchanged (the
  full object, resourceVersion and managedFields included) after install and after uninstall.
- The with-kserve controller, run as the profile's ServiceAccount with the Deployment's
  flags, becomes ready (it reads its own ConfigMap and KServe's through the profile's RBAC),
  takes its own Lease, issues its webhook certificate into its own Secret and patches only
  its own webhook configurations, leaving KServe's objects untouched.
- Uninstalling either profile removes everything the profile created and nothing else: the
  CRDs and a LocalModelNodeGroup they hold survive; a reinstall then works.
The logic lives in localcache.runtime.testing.installs, for the real-node e2e tests to reuse.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcache.runtime.testing import crds as crd_install
from localcache.runtime.testing import installs
from localcache.runtime.testing.controlplane import ControlPlane, free_port
from localcache.runtime.testing.waiting import wait_until_sync

S3_ENDPOINT = "minio.users-own-endpoint.example:9000"
KSERVE_CRDS = [
    *(f"{p}.serving.kserve.io" for p in ("inferenceservices", "clusterstoragecontainers")),
    *(
        f"{p}.serving.kserve.io"
        for p in (
            "localmodelcaches",
            "localmodelnamespacecaches",
            "localmodelnodes",
            "localmodelnodegroups",
        )
    ),
]
WATCHED: list[installs.Identity] = [
    ("Namespace", "", "kserve"),
    ("ConfigMap", "kserve", "inferenceservice-config"),
    *(("CustomResourceDefinition", "", name) for name in KSERVE_CRDS),
]
NODE_GROUP = installs.REPO_ROOT / "manifests" / "samples" / "nodegroup.yaml"
TOOLS: tuple[installs.Tool, ...] = ("kustomize", "helm")


@pytest.fixture(scope="module")
def cluster() -> Iterator[ControlPlane]:
    plane = ControlPlane(with_kcm=False)
    if not plane.kcm_available:
        pytest.skip("kube-controller-manager not built: namespaces would never finish deleting")
    plane.with_kcm = True
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def installer(cluster: ControlPlane) -> installs.Installer:
    kubectl = cluster.kubectl_path
    assert kubectl is not None
    inst = installs.Installer(kubectl, cluster.kubeconfig_path, installs.find_helm())
    # KServe, as its charts leave it (the CRDs are created by another field manager)
    inst.k("create", "namespace", "kserve")
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "inferenceservice-config", "namespace": "kserve"},
        "data": {
            "credentials": json.dumps({"s3": {"s3Endpoint": S3_ENDPOINT}}),
            "storageInitializer": json.dumps({"image": "kserve/storage-initializer:v0.20.0"}),
            "localModel": json.dumps({"enabled": False, "jobNamespace": "kserve-localmodel-jobs"}),
        },
    }
    cluster.kubectl("create", "-f", "-", input_text=json.dumps(config))
    crd_install.install_crds(
        cluster,
        [installs.REPO_ROOT / "manifests" / "test", installs.REPO_ROOT / "manifests" / "crds"],
    )
    return inst


def _tool(tool: installs.Tool, inst: installs.Installer) -> None:
    if tool == "helm" and inst.helm is None:
        installs.helm_or_skip()


def _rendered(cluster: ControlPlane, profile: str) -> list[installs.Identity]:
    kubectl = cluster.kubectl_path
    assert kubectl is not None
    docs = installs.kustomize(kubectl, installs.REPO_ROOT / "manifests" / "profiles" / profile)
    return [installs.identity(d) for d in docs]


def _changes(
    before: dict[installs.Identity, Any], after: dict[installs.Identity, Any]
) -> list[str]:
    return ["/".join(k) for k in before if before[k] != after[k]]


@pytest.mark.parametrize("tool", TOOLS)
def test_with_kserve_leaves_kserve_objects_byte_for_byte_unchanged(
    cluster: ControlPlane, installer: installs.Installer, tool: installs.Tool
) -> None:
    _tool(tool, installer)
    before = installer.snapshot(WATCHED)
    assert all(before.values()), "KServe's stand-in objects are missing"
    assert S3_ENDPOINT in json.dumps(before[("ConfigMap", "kserve", "inferenceservice-config")])

    installer.install("with-kserve", tool)
    assert installer.exists(("Deployment", "localcache", "localcache-controller"))
    assert installer.exists(("Role", "kserve", "localcache-read-kserve-config"))
    assert _changes(before, installer.snapshot(WATCHED)) == [], "changed by the install"
    for sa in ("localcache-controller", "localcache-agent"):
        for verb, allowed in (("get", "yes"), ("watch", "yes"), ("update", "no"), ("delete", "no")):
            answer = installer.k(
                "auth",
                "can-i",
                verb,
                "configmaps/inferenceservice-config",
                "-n",
                "kserve",
                f"--as=system:serviceaccount:localcache:{sa}",
                check=False,
            )
            assert answer.strip() == allowed, f"{sa} {verb} KServe's ConfigMap: {answer}"

    installer.uninstall("with-kserve", tool)
    installer.wait_gone(_rendered(cluster, "with-kserve"))
    assert _changes(before, installer.snapshot(WATCHED)) == [], "changed by the uninstall"


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("profile", installs.PROFILES)
def test_install_uninstall_reinstall_removes_only_what_it_created(
    cluster: ControlPlane, installer: installs.Installer, profile: str, tool: installs.Tool
) -> None:
    _tool(tool, installer)
    if profile == "standalone" and tool == "kustomize":
        installer.install_crds()  # the separate step; the chart's crds/ do it for Helm
    created = _rendered(cluster, profile)
    installer.k("apply", "-f", str(NODE_GROUP))
    for attempt in ("install", "reinstall"):
        installer.install(profile, tool)
        missing = [i for i in created if not installer.exists(i)]
        assert missing == [], f"{attempt}: not created"
        installer.uninstall(profile, tool)
        installer.wait_gone(created)
        kept = [("CustomResourceDefinition", "", n) for n in KSERVE_CRDS]
        kept += [("LocalModelNodeGroup", "", "workers"), ("Namespace", "", "kserve")]
        assert [i for i in kept if not installer.exists(i)] == [], f"{attempt}: deleted"


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


def _ca_bundles(installer: installs.Installer, kind: str, name: str) -> list[str]:
    obj = json.loads(installer.k("get", kind, name, "-o", "json"))
    return [w["clientConfig"].get("caBundle", "") for w in obj["webhooks"]]


def test_with_kserve_controller_runs_on_the_profile_rbac_and_names(
    cluster: ControlPlane, installer: installs.Installer, tmp_path: Path
) -> None:
    profile = installs.REPO_ROOT / "manifests" / "profiles" / "with-kserve"
    kubectl = cluster.kubectl_path
    assert kubectl is not None
    (deployment,) = [d for d in installs.kustomize(kubectl, profile) if d["kind"] == "Deployment"]
    (manager,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {"--metrics-port": free_port(), "--webhook-port": free_port()}
    args = [a for a in manager["args"] if a.split("=")[0] not in ports]
    args += [f"{flag}={port}" for flag, port in ports.items()]
    args += ["--bind-address=127.0.0.1", f"--webhook-cert-dir={tmp_path / 'certs'}"]
    namespace = deployment["metadata"]["namespace"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    kubeconfig = cluster.write_kubeconfig(
        cluster.service_account_credentials(namespace, account), tmp_path / "sa.kubeconfig"
    )
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(POD_NAMESPACE=namespace, POD_NAME="controller-0", HOME=str(tmp_path))
    before = installer.snapshot(WATCHED)
    installer.install("with-kserve", "kustomize")
    log = tmp_path / "controller.log"
    try:
        with (
            log.open("w") as out,
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "localcache",
                    "controller",
                    f"--kubeconfig={kubeconfig}",
                    *args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tmp_path,
            ) as proc,
        ):
            try:
                readyz = f"http://127.0.0.1:{ports['--metrics-port']}/readyz"
                wait_until_sync(
                    lambda: _ready(readyz) or proc.poll() is not None,
                    timeout=90,
                    what="the with-kserve controller passed /readyz",
                )
                assert proc.poll() is None, log.read_text()[-3000:]
                wait_until_sync(
                    lambda: all(
                        _ca_bundles(installer, kind, name)[0]
                        for kind, name in (
                            ("mutatingwebhookconfiguration", "localcache-inferenceservice"),
                            ("validatingwebhookconfiguration", "localcache-caches"),
                        )
                    ),
                    timeout=60,
                    interval=0.5,
                    what="the controller patched caBundle into its own webhook configurations",
                )
                assert installer.exists(("Secret", namespace, "localcache-webhook-cert"))
                wait_until_sync(
                    lambda: installer.exists(("Lease", namespace, "localcache-controller")),
                    timeout=60,
                    interval=0.5,
                    what="the controller took its own Lease",
                )
                bundle = _ca_bundles(
                    installer, "validatingwebhookconfiguration", "localcache-caches"
                )
                assert b"BEGIN CERTIFICATE" in base64.b64decode(bundle[0])
                assert _changes(before, installer.snapshot(WATCHED)) == []
            finally:
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(timeout=30)
        text = log.read_text()
        assert code == 0, text[-3000:]
        assert '"under": "kserve/inferenceservice-config"' in text  # config_loaded
        assert "forbidden" not in text.lower(), text[-3000:]
    finally:
        installer.uninstall("with-kserve", "kustomize")
        installer.wait_gone(_rendered(cluster, "with-kserve"))
    assert _changes(before, installer.snapshot(WATCHED)) == []
