"""Download Job construction (reference §4.4, §8.2 job-shape scenarios; spec §5 Job shape)."""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localcache.agent.disk import layout
from localcache.agent.jobs import jobs
from localcache.api import modelnode, nodegroup, storage
from localcache.caching import config, credentials, downloadcontainer, downloadenv, keys, names

URI = "s3://mybucket/mymodel"
KEY = keys.storage_key(URI)
NODE = "node-1"
SUFFIX = "abcd1234"
LOCAL_MODEL = config.LocalModelConfig()
INITIALIZER = config.StorageInitializerConfig()
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
HF_ENV = [{"name": name, "value": value} for name, value in downloadenv.HF_DEFAULTS]
"""The Hugging Face variables KServe gives storage-initializer containers (issue 21)."""


def _entry(**fields: Any) -> modelnode.LocalModelInfo:
    return modelnode.LocalModelInfo.model_validate(
        {"sourceModelUri": URI, "modelName": "iris", "nodeGroup": "gpu", **fields}
    )


def _node(name: str = NODE) -> modelnode.LocalModelNode:
    return modelnode.LocalModelNode.model_validate(
        {"metadata": {"name": name, "uid": "uid-1"}, "spec": {"localModels": []}}
    )


def _group(
    name: str = "gpu", tolerations: list[dict[str, Any]] | None = None
) -> nodegroup.LocalModelNodeGroup:
    spec: dict[str, Any] = {
        "storageLimit": "10Gi",
        "persistentVolumeSpec": {"hostPath": {"path": "/models"}, "capacity": {"storage": "10Gi"}},
        "persistentVolumeClaimSpec": {"resources": {"requests": {"storage": "10Gi"}}},
    }
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return nodegroup.LocalModelNodeGroup.model_validate({"metadata": {"name": name}, "spec": spec})


def _csc(name: str, *, prefix: str = "s3://", workload: str | None = "localModelDownloadJob",
         disabled: bool | None = None, container: dict[str, Any] | None = None,
         regex: str | None = None) -> storage.ClusterStorageContainer:  # fmt: skip
    fmt = {"regex": regex} if regex else {"prefix": prefix}
    spec: dict[str, Any] = {
        "container": container or {"name": f"{name}-c", "image": f"{name}:1"},
        "supportedUriFormats": [fmt],
    }
    if workload:
        spec["workloadType"] = workload
    body: dict[str, Any] = {"metadata": {"name": name}, "spec": spec}
    if disabled is not None:
        body["disabled"] = disabled
    return storage.ClusterStorageContainer.model_validate(body)


def _job(
    entry: modelnode.LocalModelInfo | None = None,
    *,
    injection: credentials.Injection | None = None,
    container: dict[str, Any] | None = None,
    local_model: config.LocalModelConfig = LOCAL_MODEL,
    group: nodegroup.LocalModelNodeGroup | None = None,
    node: modelnode.LocalModelNode | None = None,
    attempt: int = 0,
    backoff_limit: int | None = None,
) -> dict[str, Any]:
    return jobs.build_job(
        entry=entry or _entry(),
        node=node or _node(),
        node_group=group or _group(),
        storage_key=KEY,
        attempt=attempt,
        container=container or downloadcontainer.select_container(URI, [], INITIALIZER),
        injection=injection or credentials.Injection(uri=URI),
        local_model=local_model,
        backoff_limit=backoff_limit,
        suffix=SUFFIX,
    )


def _pod(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def test_default_job_has_the_kserve_shape_with_a_staging_subpath() -> None:
    job = _job()
    name = job["metadata"]["name"]
    assert job["apiVersion"] == "batch/v1"
    assert job["kind"] == "Job"
    assert job["metadata"]["namespace"] == "kserve-localmodel-jobs"
    assert job["spec"]["ttlSecondsAfterFinished"] == 3600
    assert "backoffLimit" not in job["spec"]
    pod = _pod(job)
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": NODE}
    assert "nodeName" not in pod
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"] == {"fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
    assert "serviceAccountName" not in pod
    assert "tolerations" not in pod
    assert pod["volumes"] == [
        {"name": "kserve-pvc-source", "persistentVolumeClaim": {"claimName": "iris-gpu"}}
    ]
    [container] = pod["containers"]
    assert container == {
        "name": "kserve-localmodel-download",
        "image": "kserve/storage-initializer:latest",
        "resources": {
            "requests": {"cpu": "100m", "memory": "100Mi"},
            "limits": {"cpu": "1", "memory": "1Gi"},
        },
        "args": [URI, "/mnt/models"],
        "env": HF_ENV,
        "volumeMounts": [
            {
                "name": "kserve-pvc-source",
                "mountPath": "/mnt/models",
                "readOnly": False,
                "subPath": f".staging/{KEY}-{name}",
            }
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": jobs.RESTRICTED_CONTAINER,
    }
    assert container["volumeMounts"][0]["subPath"] == layout.staging_subpath(KEY, name)


def test_job_is_owned_by_the_local_model_node() -> None:
    assert _job()["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "serving.kserve.io/v1alpha1",
            "kind": "LocalModelNode",
            "name": NODE,
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_cluster_entry_labels_and_pvc() -> None:
    job = _job(_entry(nodeGroup="sklearn-nodegroup", modelName="sklearn-model"),
               group=_group("sklearn-nodegroup"))  # fmt: skip
    assert job["metadata"]["labels"] == {"model": "sklearn-model", "node": NODE, "storageKey": KEY}
    assert job["spec"]["template"]["metadata"]["labels"] == job["metadata"]["labels"]
    claim = _pod(job)["volumes"][0]["persistentVolumeClaim"]["claimName"]
    # a dashed group makes `{cache}-{group}` ambiguous: shortened like the controller's name
    assert claim == names.download_pvc("sklearn-model", "sklearn-nodegroup", namespaced=False)
    assert claim.startswith("sklearn-model-sklearn-nodegroup--")


def test_namespace_entry_runs_in_its_namespace_with_its_download_pvc() -> None:
    job = _job(_entry(namespace="team-a", modelName="sklearn-model", nodeGroup="ng"),
               group=_group("ng"))  # fmt: skip
    assert job["metadata"]["namespace"] == "team-a"
    assert job["metadata"]["labels"] == {
        "model": "sklearn-model",
        "node": NODE,
        "modelNamespace": "team-a",
        "storageKey": KEY,
    }
    claim = _pod(job)["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim == "sklearn-model-ng-download"


def test_config_sets_namespace_fs_group_and_ttl() -> None:
    local_model = config.LocalModelConfig.model_validate(
        {"jobNamespace": "jobs", "fsGroup": None, "jobTTLSecondsAfterFinished": 60}
    )
    job = _job(local_model=local_model)
    assert job["metadata"]["namespace"] == "jobs"
    assert job["spec"]["ttlSecondsAfterFinished"] == 60
    assert "fsGroup" not in _pod(job)["securityContext"]


def test_backoff_limit_is_set_only_when_given() -> None:
    assert _job(backoff_limit=0)["spec"]["backoffLimit"] == 0


def test_tolerations_come_from_the_node_group() -> None:
    tolerations: list[dict[str, Any]] = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute",
         "tolerationSeconds": 30},
    ]  # fmt: skip
    assert _pod(_job(group=_group(tolerations=tolerations)))["tolerations"] == tolerations


def test_credentials_are_merged_into_the_pod() -> None:
    injection = credentials.Injection(
        uri="s3://models/path",
        env=(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}},
        ),
        volumes=({"name": "user-gcp-sa", "secret": {"secretName": "gcs"}},),
        volume_mounts=({"name": "user-gcp-sa", "mountPath": "/var/secrets/", "readOnly": True},),
        service_account_name="reader",
        pod_labels={"azure.workload.identity/use": "true"},
    )
    job = _job(injection=injection)
    pod = _pod(job)
    [container] = pod["containers"]
    assert container["args"] == ["s3://models/path", "/mnt/models"]
    assert container["env"] == [*HF_ENV, *injection.env]
    assert [m["name"] for m in container["volumeMounts"]] == ["kserve-pvc-source", "user-gcp-sa"]
    assert [v["name"] for v in pod["volumes"]] == ["kserve-pvc-source", "user-gcp-sa"]
    assert pod["serviceAccountName"] == "reader"
    assert job["spec"]["template"]["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert "azure.workload.identity/use" not in job["metadata"]["labels"]
    container["env"].append({"name": "X", "value": "y"})
    assert len(injection.env) == 1  # the Job holds copies


def test_matching_cluster_storage_container_wins() -> None:
    containers = [
        _csc("a-disabled", disabled=True),
        _csc("b-init", workload=None),
        _csc("c-gcs", prefix="gs://"),
        _csc("e-second"),
        _csc("d-first", container={
            "name": "custom", "image": "custom:1",
            "env": [{"name": "FROM_CSC", "value": "1"}],
            "volumeMounts": [{"name": "dropped", "mountPath": "/x"}],
            "resources": {"limits": {"memory": "4Gi"}},
        }),
    ]  # fmt: skip
    chosen = downloadcontainer.select_container(URI, containers, INITIALIZER)
    assert chosen["image"] == "custom:1"
    assert chosen["resources"] == {"limits": {"memory": "4Gi"}}
    injection = credentials.Injection(uri=URI, env=({"name": "HF_TOKEN", "value": "ref"},))
    [container] = _pod(_job(container=chosen, injection=injection))["containers"]
    assert container["name"] == "custom"
    assert container["env"] == [
        {"name": "FROM_CSC", "value": "1"},
        *HF_ENV,
        {"name": "HF_TOKEN", "value": "ref"},
    ]
    assert [m["name"] for m in container["volumeMounts"]] == ["kserve-pvc-source"]
    assert containers[4].spec.container["env"] == [{"name": "FROM_CSC", "value": "1"}]


def test_storage_container_by_regex_gets_initializer_resources_when_it_has_none() -> None:
    chosen = downloadcontainer.select_container(
        "hf://org/m", [_csc("hf", regex=r"^hf://")], INITIALIZER
    )
    assert chosen["image"] == "hf:1"
    assert chosen["resources"] == INITIALIZER.resources()


def test_no_matching_storage_container_falls_back_to_storage_initializer_image() -> None:
    initializer = config.StorageInitializerConfig.model_validate({"image": "my/init:2"})
    chosen = downloadcontainer.select_container("hf://org/m", [_csc("s3")], initializer)
    assert chosen["image"] == "my/init:2"
    assert chosen["name"] == "kserve-localmodel-download"


def test_bad_storage_container_regex_is_a_job_error() -> None:
    with pytest.raises(downloadcontainer.ContainerError, match="bad"):
        downloadcontainer.select_container(URI, [_csc("bad", regex="(")], INITIALIZER)


def test_job_name_is_distinct_per_node_scope_attempt_and_suffix() -> None:
    def name(
        node: str = NODE, attempt: int = 0, scope: Hashable = None, suffix: str = SUFFIX
    ) -> str:
        return jobs.job_name(
            storage_key=KEY, node_name=node, attempt=attempt, scope=scope, suffix=suffix
        )

    assert name() == name()
    variants = {
        name(),
        name(attempt=1),
        name(node="node-2"),
        name(scope=("ns", "sa")),
        name(suffix="zz99zz99"),
    }
    assert len(variants) == 5
    long = name(node="n" * 253, attempt=10**6, scope=("x" * 300,))
    assert len(long) <= 63
    assert DNS_LABEL.fullmatch(long)
    assert layout.staging_name(KEY, long)
    assert _job(attempt=3)["metadata"]["name"] == name(attempt=3)
    with pytest.raises(ValueError, match="attempt"):
        name(attempt=-1)
    with pytest.raises(ValueError, match="suffix"):
        name(suffix="UPPER123")


def test_name_suffixes_are_random() -> None:
    """A squatter cannot pre-create the name of the next download Job."""
    suffixes = {jobs.name_suffix() for _ in range(50)}
    assert len(suffixes) == 50
    assert all(len(s) == jobs.SUFFIX_LENGTH for s in suffixes)


def test_termination_message_falls_back_to_the_log_tail_whatever_the_template_says() -> None:
    """Issue 21: KServe's storage initializer writes no termination message, so the log tail
    is the only place its reason is; the agent publishes only its gist (test_failures.py)."""
    container = {"name": "c", "image": "x", "terminationMessagePolicy": "File"}
    [main] = _pod(_job(container=container))["containers"]
    assert main["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_long_names_give_valid_distinct_labels() -> None:
    node = "ip-10-0-0-1." + "a" * 60 + ".compute.internal"
    job = _job(_entry(modelName="m" * 100, namespace="n" * 63), node=_node(node))
    labels = job["metadata"]["labels"]
    for value in labels.values():
        assert len(value) <= 63
        assert LABEL_VALUE.fullmatch(value)
    assert labels["node"] != jobs.label_value(node + "x")
    assert labels["node"] == jobs.label_value(node)
    assert labels["modelNamespace"] == "n" * 63


@given(st.text(max_size=300))
def test_label_value_is_always_valid_and_keeps_valid_values(value: str) -> None:
    label = jobs.label_value(value)
    assert len(label) <= 63
    assert LABEL_VALUE.fullmatch(label)
    if len(value) <= 63 and LABEL_VALUE.fullmatch(value):
        assert label == value


def test_an_agents_download_jobs_fail_on_the_first_failed_pod_by_default() -> None:
    """Found on real nodes: with Kubernetes' default backoffLimit a refused download stayed
    'pending' for ~10 minutes of pod retries before its Job failed and status said so."""
    from localcache.agent import setup as agent_setup

    assert agent_setup.AgentSettings(node_name="node-1").job_backoff_limit == 0
