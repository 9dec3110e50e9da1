"""The install profiles' RBAC and admission policies on a real control plane of its own (with
kube-controller-manager, so namespaces finish deleting), beside KServe-like objects: namespace
`kserve`, KServe's `inferenceservice-config` carrying a user's `s3Endpoint`, KServe's CRDs (the
stand-ins of manifests/test) and the four localmodel CRDs (stand-in: our own manifests/crds).
Installing, uninstalling and reinstalling each profile with kustomize and Helm beside KServe's
real objects, byte for byte, is tested on real nodes (tests/e2e/profiles).

- The with-kserve controller, run as the profile's ServiceAccount with the Deployment's
  flags, becomes ready (it reads its own ConfigMap and KServe's through the profile's RBAC),
  takes its own Lease, issues its webhook certificate and the peer TLS bundle into its own
  Secrets and patches only its own webhook configurations, leaving KServe's objects untouched.
- KServe's localmodelcache sample (issue 12): an unlabelled ServiceAccount `hf-downloader` in
  the job namespace, named by a LocalModelCache, its download Job run as it by the agent.
  with-kserve's job namespace is KServe's `kserve-localmodel-jobs` (created beforehand, as
  KServe's docs say, and kept by the uninstall): its config names it and its policies accept
  the cache and the agent's Job; standalone's policies still require the label
  localmodel.kserve.io/download=true in its own `localcache-jobs`.
The install helpers live in tests.support.installs, shared with the real-node e2e tests.
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

from localcache.devenv import crds as crd_install
from localcache.devenv.assets import free_port
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until_sync
from tests.integration.security import harness
from tests.support import installs

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


def _rendered(cluster: ControlPlane, profile: str) -> list[installs.Identity]:
    kubectl = cluster.kubectl_path
    assert kubectl is not None
    docs = installs.kustomize(kubectl, installs.REPO_ROOT / "manifests" / "profiles" / profile)
    return [installs.identity(d) for d in docs]


def _changes(
    before: dict[installs.Identity, Any], after: dict[installs.Identity, Any]
) -> list[str]:
    return ["/".join(k) for k in before if before[k] != after[k]]


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
                        all(_ca_bundles(installer, kind, name))
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
                wait_until_sync(
                    lambda: installer.exists(("Secret", namespace, "localcache-peer-tls")),
                    timeout=60,
                    interval=0.5,
                    what="the controller issued the peer TLS bundle into its own namespace",
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


JOB_NAMESPACES = {"standalone": "localcache-jobs", "with-kserve": "kserve-localmodel-jobs"}
SAMPLE_SA = "hf-downloader"  # KServe v0.20 docs/samples/localmodelcache
NODE = "sample-node"
LMC = "/apis/serving.kserve.io/v1alpha1/localmodelcaches"


def _sample_cache(uri: str, *, service_account: str | None = SAMPLE_SA) -> dict[str, Any]:
    spec: dict[str, Any] = {"sourceModelUri": uri, "modelSize": "1Gi", "nodeGroups": ["workers"]}
    if service_account is not None:
        spec["serviceAccountName"] = service_account
    return {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelCache",
            "metadata": {"name": "meta-llama3-8b-instruct"}, "spec": spec}  # fmt: skip


def _dry_run(cluster: ControlPlane, body: dict[str, Any]) -> tuple[int, str]:
    status, answer = cluster.rest("POST", f"{LMC}?dryRun=All", body)
    return status, answer.get("message", "") if isinstance(answer, dict) else str(answer)


def _check_agent_job(cluster: ControlPlane, profile: str, jobs: str) -> None:
    """The agent (a token bound to its pod on NODE) creates the sample cache's download Job
    in the job namespace, as the sample's ServiceAccount (dry run)."""
    lmn = harness.ok(
        cluster.rest(
            "POST",
            "/apis/serving.kserve.io/v1alpha1/localmodelnodes",
            {
                "apiVersion": "serving.kserve.io/v1alpha1",
                "kind": "LocalModelNode",
                "metadata": {"name": NODE},
                "spec": {"localModels": []},
            },
        ),
        "LocalModelNode",
    )
    token = harness.agent_token(
        cluster, NODE, namespace="localcache", service_account="localcache-agent"
    )
    spec = {
        "restartPolicy": "Never",
        "serviceAccountName": SAMPLE_SA,
        "containers": [{"name": "storage-initializer", "image": "kserve/storage-initializer"}],
    }
    job = harness.job(
        jobs, "lmd-sample", spec, node=NODE, node_uid=lmn["metadata"]["uid"],
        labels={"model": "meta-llama3-8b-instruct"},
    )  # fmt: skip
    path = f"/apis/batch/v1/namespaces/{jobs}/jobs?dryRun=All"
    if profile == "with-kserve":
        harness.ok(harness.rest_as_token(cluster, token, "POST", path, job), "the agent's Job")
        return
    message = wait_until_sync(
        lambda: harness.denied(
            harness.rest_as_token(cluster, token, "POST", path, job), "the agent's Job"
        ),
        timeout=30,
        interval=0.5,
        what="standalone refuses the agent's Job as an unlabelled ServiceAccount",
    )
    assert f"ServiceAccount {SAMPLE_SA} is not labelled" in message, message


@pytest.mark.parametrize("profile", installs.PROFILES)
def test_kserve_sample_service_account_in_the_job_namespace(
    cluster: ControlPlane, installer: installs.Installer, profile: str
) -> None:
    jobs = JOB_NAMESPACES[profile]
    if profile == "with-kserve":
        installer.k("create", "namespace", jobs)  # KServe's docs: the user creates it
    installer.install(profile, "kustomize")
    try:
        config = json.loads(
            installer.k("get", "configmap", "localcache-config", "-n", "localcache", "-o", "json")
        )
        assert json.loads(config["data"]["localModel"])["jobNamespace"] == jobs
        installer.k("create", "serviceaccount", SAMPLE_SA, "-n", jobs)  # unlabelled
        # only the policies are under test: the webhook has no server here (re-applied below)
        installer.k("delete", "validatingwebhookconfiguration", "localcache-caches")
        # the policies are in force once a file:// cache is refused (localcache-cache-uri).
        # The probe names no ServiceAccount: one naming the unlabelled one breaks a second
        # policy in standalone, and the apiserver reports the first denial in an order that
        # changes with each compilation of its policies (a Go map's), so the message would be
        # either policy's
        probe = _sample_cache("file:///x", service_account=None)
        wait_until_sync(
            lambda: "reads the download pod" in _dry_run(cluster, probe)[1],
            timeout=30,
            interval=0.5,
            what=f"{profile}'s policies refuse a file:// cache",
        )
        sample = _sample_cache("hf://meta-llama/meta-llama-3-8b-instruct")
        if profile == "with-kserve":
            status, message = _dry_run(cluster, sample)
            assert status == 201, message
        else:
            wait_until_sync(
                lambda: f"{jobs}/{SAMPLE_SA} is not labelled" in _dry_run(cluster, sample)[1],
                timeout=30,
                interval=0.5,
                what="standalone refuses a cache naming an unlabelled ServiceAccount",
            )
        _check_agent_job(cluster, profile, jobs)
    finally:
        # the token's pod: bound to a node without a kubelet, it would never finish deleting
        installer.k(
            "delete", "pods", "-n", "localcache", f"--field-selector=spec.nodeName={NODE}",
            "--force", "--grace-period=0", "--ignore-not-found",
        )  # fmt: skip
        installer.k("delete", "localmodelnode", NODE, "--ignore-not-found")
        installer.install(profile, "kustomize")  # the webhook configuration back, to delete
        installer.uninstall(profile, "kustomize")
        installer.wait_gone(_rendered(cluster, profile))
    if profile == "with-kserve":
        assert installer.exists(("Namespace", "", jobs)), "KServe's job namespace was deleted"
        assert installer.exists(("ServiceAccount", jobs, SAMPLE_SA))
        installer.k("delete", "namespace", jobs, "--wait=false")
        installer.wait_gone([("Namespace", "", jobs)])
    else:
        assert not installer.exists(("Namespace", "", jobs))
