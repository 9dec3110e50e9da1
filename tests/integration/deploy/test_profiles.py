"""The install profiles, rendered: `kubectl kustomize manifests/profiles/<p>` (the control
plane's kubectl) and `helm template charts/localcache --set profile=<p>` give the same
objects, and the generated files are what hack/genprofiles.py makes of manifests/default.
Tests that need helm skip when hack/build-helm.sh has not built it (and fail instead under
LOCALCACHE_REQUIRE_HELM=1, as `.ci/run` sets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from localcache.devenv.controlplane import ControlPlane
from tests.support import installs


def _kubectl(control_plane: ControlPlane) -> str:
    kubectl = control_plane.kubectl_path
    assert kubectl is not None, "no kubectl beside the control plane or on PATH"
    return kubectl


def _normal(docs: list[dict[str, Any]]) -> list[str]:
    """Order-free, formatting-free: each object as canonical JSON, sorted."""
    return sorted(json.dumps(d, sort_keys=True) for d in docs)


def test_generated_profiles_and_chart_are_up_to_date(control_plane: ControlPlane) -> None:
    done = subprocess.run(
        [sys.executable, str(installs.REPO_ROOT / "hack" / "genprofiles.py"), "--check"],
        env={**os.environ, "KUBECTL": _kubectl(control_plane)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("profile", installs.PROFILES)
def test_helm_template_renders_exactly_the_kustomize_build(
    control_plane: ControlPlane, profile: str
) -> None:
    helm = installs.helm_or_skip()
    built = installs.kustomize(
        _kubectl(control_plane), installs.REPO_ROOT / "manifests" / "profiles" / profile
    )
    rendered = installs.helm_template(helm, profile)
    assert {installs.identity(d) for d in rendered} == {installs.identity(d) for d in built}
    assert _normal(rendered) == _normal(built)


def test_helm_values_reach_every_place() -> None:
    helm = installs.helm_or_skip()
    docs = installs.helm_template(
        helm,
        "with-kserve",
        "--set",
        "namespace=models-system",
        "--set",
        "jobNamespace=models-jobs",
        "--set",
        "image=registry.example/localcache:1.2.3",
        "--set",
        "modelsRoot=/data/models",
        "--set",
        "kserveModelsRoot=/data/kserve",
        "--set",
        "kubeletDir=/var/lib/k0s/kubelet",
        "--set-json",
        # Helm merges maps with the default: null removes the default label
        'nodeSelector={"kserve/localmodel":null,"pool":"gpu"}',
        "--set-json",
        'agentTolerations=[{"key":"dedicated","operator":"Exists","effect":"NoSchedule"}]',
    )
    text = json.dumps(docs)
    defaults = (
        "localcache:0.1.0",
        "/mnt/models",
        "kserve/localmodel",
        "localmodel-jobs",
        "/var/lib/kubelet",
    )
    for default in (*defaults, '"localcache-jobs"'):
        assert default not in text, default
    assert not [d for d in docs if d["metadata"].get("namespace") == "localcache"]
    (agent,) = [d for d in docs if d["kind"] == "DaemonSet"]
    spec = agent["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"pool": "gpu"}
    dedicated = {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
    assert spec["tolerations"] == [dedicated]
    assert spec["volumes"][0]["hostPath"]["path"] == "/data/models"
    assert spec["volumes"][1]["hostPath"]["path"] == "/data/kserve"
    roots = "--models-roots=/data/models=/data/models,/data/kserve=/mnt/kserve-models"
    assert roots in spec["containers"][0]["args"]
    (csi,) = [c for c in spec["containers"] if c["name"] == "csi-node"]
    socket = "/var/lib/k0s/kubelet/plugins/localcache.csi.kserve.io/csi.sock"
    assert f"--kubelet-endpoint={socket}" in csi["args"]
    pods = next(m for m in csi["volumeMounts"] if m["name"] == "kubelet-pods")
    assert pods["mountPath"] == "/var/lib/k0s/kubelet/pods"  # the kubelet's target paths
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    assert host["kubelet-pods"] == "/var/lib/k0s/kubelet/pods"
    assert host["csi-registration"] == "/var/lib/k0s/kubelet/plugins_registry"
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert json.loads(config["data"]["localModel"])["jobNamespace"] == "models-jobs"
    assert "system:serviceaccount:models-system:localcache-agent" in text
    assert installs.kserve_clashes(docs) == []


@pytest.mark.parametrize(
    ("profile", "jobs"),
    [("standalone", "localcache-jobs"), ("with-kserve", "kserve-localmodel-jobs")],
)
def test_helm_job_namespace_defaults_to_the_profile_s(profile: str, jobs: str) -> None:
    """with-kserve runs Jobs in KServe's job namespace and, as it is KServe's, never creates
    it (nor deletes it on uninstall); standalone creates its own."""
    helm = installs.helm_or_skip()
    docs = installs.helm_template(helm, profile)
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert json.loads(config["data"]["localModel"])["jobNamespace"] == jobs
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    assert (jobs in namespaces) == (profile == "standalone")
    assert [d for d in docs if d["metadata"].get("namespace") == jobs] == []


def test_an_unknown_profile_is_refused() -> None:
    helm = installs.helm_or_skip()
    with pytest.raises(AssertionError, match="profile must be standalone or with-kserve"):
        installs.helm_template(helm, "kserve")
