"""Each profile's job namespace (issue 12): standalone creates and uses `localcache-jobs`;
with-kserve runs download Jobs in KServe's `kserve-localmodel-jobs`, which it neither creates
nor deletes, names it in localcache-config and in every policy, and does not require the
ServiceAccounts there to be labelled localmodel.kserve.io/download=true (KServe's sample's
`hf-downloader` is not)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support import installs
from tests.unit.deploy.test_profile_names import profile_docs

JOB_NAMESPACES = {"standalone": "localcache-jobs", "with-kserve": "kserve-localmodel-jobs"}
LABEL_POLICIES = (
    "localcache-job-namespace-serviceaccounts",
    "localcache-cluster-cache-serviceaccounts",
)
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def _config_job_namespace(docs: list[dict[str, Any]]) -> str:
    (config,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "localcache-config"
    ]
    return str(json.loads(config["data"]["localModel"])["jobNamespace"])


def _policies(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in POLICY_KINDS}


@pytest.mark.parametrize("profile", installs.PROFILES)
def test_config_and_policies_name_the_profile_s_job_namespace(profile: str) -> None:
    docs = profile_docs(profile)
    jobs = JOB_NAMESPACES[profile]
    assert _config_job_namespace(docs) == jobs
    (binding,) = [
        d for d in docs if d["metadata"]["name"] == "localcache-agent-job-namespaces"
        and d["kind"] == "ValidatingAdmissionPolicyBinding"
    ]  # fmt: skip
    (excluded,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert excluded["values"] == [jobs]
    other = next(ns for p, ns in JOB_NAMESPACES.items() if p != profile)
    assert other not in json.dumps(docs), f"{profile} names {other}"


def test_standalone_creates_its_job_namespace() -> None:
    namespaces = [
        d["metadata"]["name"] for d in profile_docs("standalone") if d["kind"] == "Namespace"
    ]
    assert sorted(namespaces) == ["localcache", "localcache-jobs"]


def test_with_kserve_creates_nothing_in_kserve_s_job_namespace() -> None:
    """Neither the namespace (an uninstall would delete KServe's) nor anything namespaced in
    it (an install would fail where it does not exist yet)."""
    docs = profile_docs("with-kserve")
    jobs = JOB_NAMESPACES["with-kserve"]
    assert [installs.identity(d) for d in docs if d["kind"] == "Namespace"] == [
        ("Namespace", "", "localcache")
    ]
    assert [installs.identity(d) for d in docs if d["metadata"].get("namespace") == jobs] == []
    assert ("Namespace", "", jobs) in installs.KSERVE_OBJECTS


def test_only_standalone_requires_the_download_label_in_the_job_namespace() -> None:
    standalone, with_kserve = (_policies(profile_docs(p)) for p in installs.PROFILES)
    for name in LABEL_POLICIES:
        for kind in POLICY_KINDS:
            assert (kind, name) in standalone
            assert (kind, name) not in with_kserve
    binding = standalone[("ValidatingAdmissionPolicyBinding", LABEL_POLICIES[1])]
    assert binding["spec"]["paramRef"]["namespace"] == JOB_NAMESPACES["standalone"]
    assert "localmodel.kserve.io/download" not in json.dumps(list(with_kserve.values()))
    # every other policy is kept
    assert set(standalone) - set(with_kserve) == {
        (k, n) for n in LABEL_POLICIES for k in POLICY_KINDS
    }
