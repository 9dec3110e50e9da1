"""The shipped webhook manifests: paths, policies and names the server and CertManager rely on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from localcache.api import inferenceservice as isvc_api
from localcache.runtime.serving import certgen
from localcache.webhooks import llmisvc, podwait
from localcache.webhooks import setup as webhooks_setup

ROOT = Path(__file__).resolve().parents[3] / "manifests" / "webhook"


def _load(name: str) -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / name).read_text())
    assert isinstance(loaded, dict)
    return loaded


def _hooks(name: str) -> dict[str, dict[str, Any]]:
    return {h["clientConfig"]["service"]["path"]: h for h in _load(name)["webhooks"]}


def test_isvc_mutation_ignores_failures_and_matches_create_and_update() -> None:
    config = _load("mutating.yaml")
    assert config["metadata"]["name"] == webhooks_setup.MUTATING_CONFIGURATION
    hook = _hooks("mutating.yaml")["/mutate-serving-kserve-io-v1beta1-inferenceservice"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["rules"] == [
        {
            "apiGroups": ["serving.kserve.io"],
            "apiVersions": ["v1beta1"],
            "resources": ["inferenceservices"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        }
    ]


def test_llmisvc_mutation_covers_both_versions_and_is_reinvoked() -> None:
    hook = _hooks("mutating.yaml")[llmisvc.MUTATE_PATH]
    assert hook["failurePolicy"] == "Ignore"
    # IfNeeded: KServe's defaulter strips the keys and is not reinvoked; ours is (README).
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["rules"] == [
        {
            "apiGroups": ["serving.kserve.io"],
            "apiVersions": ["v1alpha1", "v1alpha2"],
            "resources": ["llminferenceservices"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        }
    ]
    # The apiserver calls configurations in name order: KServe's own LLMInferenceService
    # defaulter configuration sorts before ours.
    kserves = "llminferenceservice.serving.kserve.io"
    assert kserves < webhooks_setup.MUTATING_CONFIGURATION
    for profile in ("standalone", "with-kserve"):  # the profiles rename the configuration
        path = ROOT.parent / "profiles" / profile / "localcache.yaml"
        (renamed,) = [
            doc["metadata"]["name"]
            for doc in yaml.safe_load_all(path.read_text())
            if doc and doc["kind"] == "MutatingWebhookConfiguration"
        ]
        assert renamed > kserves


def test_both_cache_kinds_are_validated_and_failures_reject() -> None:
    config = _load("validating.yaml")
    assert config["metadata"]["name"] == webhooks_setup.VALIDATING_CONFIGURATION
    hooks = _hooks("validating.yaml")
    cluster = hooks["/validate-serving-kserve-io-v1alpha1-localmodelcache"]
    namespaced = hooks["/validate-serving-kserve-io-v1alpha1-localmodelnamespacecache"]
    for hook, resource in (
        (cluster, "localmodelcaches"),
        (namespaced, "localmodelnamespacecaches"),
    ):
        assert hook["failurePolicy"] == "Fail"
        (rule,) = hook["rules"]
        assert rule["resources"] == [resource]
        assert rule["operations"] == ["CREATE", "UPDATE", "DELETE"]
    assert cluster["rules"][0]["scope"] == "Cluster"
    assert namespaced["rules"][0]["scope"] == "Namespaced"


def test_every_webhook_is_side_effect_free_v1_with_a_timeout_and_our_service() -> None:
    for name in ("mutating.yaml", "validating.yaml"):
        for hook in _load(name)["webhooks"]:
            assert hook["sideEffects"] == "None"
            assert hook["admissionReviewVersions"] == ["v1"]
            assert 1 <= hook["timeoutSeconds"] <= 30
            assert "caBundle" not in hook["clientConfig"]  # CertManager or cert-manager fills it
            service = hook["clientConfig"]["service"]
            assert (service["namespace"], service["name"]) == (
                webhooks_setup.DEFAULT_NAMESPACE,
                webhooks_setup.DEFAULT_SERVICE_NAME,
            )


def test_the_service_fronts_the_webhook_port() -> None:
    service = _load("service.yaml")
    assert service["metadata"]["name"] == webhooks_setup.DEFAULT_SERVICE_NAME
    assert service["metadata"]["namespace"] == webhooks_setup.DEFAULT_NAMESPACE
    assert service["spec"]["ports"][0]["port"] == 443


def test_kustomization_lists_every_manifest() -> None:
    assert sorted(_load("kustomization.yaml")["resources"]) == sorted(
        ["service.yaml", "mutating.yaml", "validating.yaml"]
    )
    component = _load("cert-manager/kustomization.yaml")
    assert component["kind"] == "Component"
    listed = component["resources"] + [p["path"] for p in component["patches"]]
    on_disk = sorted(p.name for p in (ROOT / "cert-manager").glob("*.yaml"))
    assert sorted([*listed, "kustomization.yaml"]) == on_disk


def test_cert_manager_component_targets_our_secret_and_injects_into_both_configurations() -> None:
    cert = _load("cert-manager/certificate.yaml")
    assert cert["spec"]["secretName"] == webhooks_setup.DEFAULT_SECRET_NAME
    assert cert["spec"]["dnsNames"] == certgen.service_dns_names(
        webhooks_setup.DEFAULT_SERVICE_NAME, webhooks_setup.DEFAULT_NAMESPACE
    )
    wanted = f"{webhooks_setup.DEFAULT_NAMESPACE}/{cert['metadata']['name']}"
    patched = set()
    for name in ("inject-ca-mutating.yaml", "inject-ca-validating.yaml"):
        patch = _load(f"cert-manager/{name}")
        assert patch["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == wanted
        patched.add(patch["metadata"]["name"])
    assert patched == {
        webhooks_setup.MUTATING_CONFIGURATION,
        webhooks_setup.VALIDATING_CONFIGURATION,
    }


def test_pod_mutation_is_create_only_fails_open_fast_and_sees_only_serving_pods() -> None:
    hook = _hooks("mutating.yaml")[podwait.MUTATE_PATH]
    assert hook["failurePolicy"] == "Ignore"  # an outage never blocks pod creation
    assert hook["timeoutSeconds"] <= 5
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "operations": ["CREATE"],
            "scope": "Namespaced",
        }
    ]
    assert hook["objectSelector"] == {
        "matchExpressions": [{"key": isvc_api.LOCAL_MODEL_LABEL, "operator": "Exists"}]
    }
