"""The peer-mode download Job (`agent.jobs.peerjob`): the origin Job with the fetcher, the
token and the CA, without credentials; everything else unchanged."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
from typing import Any

import pytest

from localcache.agent.jobs import jobs, peerjob
from localcache.api import modelnode, nodegroup
from localcache.caching import config, credentials, downloadcontainer, keys
from localcache.download import peercommand, seedsums

URI = "s3://mybucket/mymodel"
KEY = keys.storage_key(URI)
DIGEST = "sha256:" + "1" * 64
SOURCES = (("node-a", "https://10.0.0.1:8476"), ("node-b", "https://10.0.0.2:8476"))
CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
IMAGE = "ghcr.io/localcache/localcache:1"
INJECTION = credentials.Injection(
    uri=URI,
    env=(
        {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "S3_ENDPOINT", "value": "minio:9000"},
    ),
    volumes=({"name": "creds", "secret": {"secretName": "gcs"}},),
    volume_mounts=({"name": "creds", "mountPath": "/var/secret", "readOnly": True},),
    service_account_name="sa-1",
)


def _origin(injection: credentials.Injection = INJECTION) -> dict[str, Any]:
    group = nodegroup.LocalModelNodeGroup.model_validate(
        {
            "metadata": {"name": "gpu"},
            "spec": {
                "storageLimit": "10Gi",
                "persistentVolumeSpec": {
                    "hostPath": {"path": "/models"}, "capacity": {"storage": "10Gi"}
                },
                "persistentVolumeClaimSpec": {"resources": {"requests": {"storage": "10Gi"}}},
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
        }
    )  # fmt: skip
    return jobs.build_job(
        entry=modelnode.LocalModelInfo.model_validate(
            {"sourceModelUri": URI, "modelName": "iris", "nodeGroup": "gpu"}
        ),
        node=modelnode.LocalModelNode.model_validate(
            {"metadata": {"name": "node-1", "uid": "uid-1"}, "spec": {"localModels": []}}
        ),
        node_group=group,
        storage_key=KEY,
        attempt=0,
        container=downloadcontainer.select_container(URI, [], config.StorageInitializerConfig()),
        injection=injection,
        local_model=config.LocalModelConfig(),
        suffix="abcd1234",
        run_as_user=1001,
        backoff_limit=0,
    )


def _peer(origin: dict[str, Any], **kw: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "image": IMAGE, "storage_key": KEY, "digest": DIGEST, "sources": SOURCES,
        "ca_pem": CA, "max_size": 1234, "injection": INJECTION, **kw,
    }  # fmt: skip
    return peerjob.peer_job(origin, **fields)


def _main(job: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = job["spec"]["template"]["spec"]["containers"][0]
    return container


def test_the_peer_job_runs_the_fetcher_with_ranked_sources() -> None:
    main = _main(_peer(_origin()))
    assert main["image"] == IMAGE
    assert main["command"] == ["localcache", "fetch"]
    assert main["args"] == [
        "--storage-key", KEY, "--digest", DIGEST,
        "--source", "node-a=https://10.0.0.1:8476", "--source", "node-b=https://10.0.0.2:8476",
        "--token-file", "/var/run/secrets/localcache/peer/token",
        "--ca-env", "LOCALCACHE_PEER_CA", "--max-size", "1234",
        "--report", "/dev/termination-log", "/mnt/models",
    ]  # fmt: skip


def test_the_peer_job_carries_the_ca_and_the_token_but_no_credentials() -> None:
    origin = _origin()
    job = _peer(origin)
    main, pod = _main(job), job["spec"]["template"]["spec"]
    env = {e["name"]: e for e in main["env"]}
    assert env["LOCALCACHE_PEER_CA"] == {"name": "LOCALCACHE_PEER_CA", "value": CA}
    assert "AWS_ACCESS_KEY_ID" not in env
    assert "S3_ENDPOINT" not in env
    assert all("valueFrom" not in e for e in main["env"])
    assert [v["name"] for v in pod["volumes"]] == ["kserve-pvc-source", "localcache-peer-token"]
    assert pod["volumes"][1]["projected"]["sources"] == [
        {"serviceAccountToken": {"audience": "localcache-peer", "expirationSeconds": 600,
                                 "path": "token"}}
    ]  # fmt: skip
    assert main["volumeMounts"] == [
        _main(origin)["volumeMounts"][0],
        {"name": "localcache-peer-token", "mountPath": "/var/run/secrets/localcache/peer",
         "readOnly": True},
    ]  # fmt: skip
    assert "creds" not in json.dumps(job)
    assert pod["automountServiceAccountToken"] is False


def test_a_projected_token_needs_a_named_service_account() -> None:
    bare = credentials.Injection(uri=URI)
    origin = _origin(bare)
    assert "serviceAccountName" not in origin["spec"]["template"]["spec"]
    pod = _peer(origin, injection=bare)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "default"


def test_everything_else_is_the_origin_jobs() -> None:
    origin = _origin()
    job = _peer(origin)
    assert job["metadata"]["name"] == origin["metadata"]["name"]
    assert job["metadata"]["namespace"] == origin["metadata"]["namespace"]
    assert job["metadata"]["ownerReferences"] == origin["metadata"]["ownerReferences"]
    assert job["metadata"]["labels"] == {**origin["metadata"]["labels"], peerjob.PEER_LABEL: "true"}
    template, before = job["spec"]["template"], origin["spec"]["template"]
    assert template["metadata"]["labels"][peerjob.PEER_LABEL] == "true"
    for key in ("nodeSelector", "tolerations", "securityContext", "serviceAccountName",
                "restartPolicy"):  # fmt: skip
        assert template["spec"][key] == before["spec"][key], key
    for key in ("securityContext", "terminationMessagePolicy", "resources", "name"):
        assert _main(job)[key] == _main(origin)[key], key
    assert {k: v for k, v in job["spec"].items() if k != "template"} == {
        k: v for k, v in origin["spec"].items() if k != "template"
    }
    assert peerjob.is_peer(job)
    assert not peerjob.is_peer(origin)


def test_the_origin_job_is_not_changed() -> None:
    origin = _origin()
    kept = copy.deepcopy(origin)
    _peer(origin)
    assert origin == kept
    assert json.dumps(_origin(), sort_keys=True) == json.dumps(kept, sort_keys=True)


def test_a_peer_job_needs_sources_and_an_image() -> None:
    with pytest.raises(ValueError, match="source"):
        _peer(_origin(), sources=())
    with pytest.raises(ValueError, match="peer-image"):
        _peer(_origin(), image="")


def test_at_most_max_sources_are_passed() -> None:
    many = tuple((f"n{i}", f"https://10.0.0.{i}:8476") for i in range(5))
    args = _main(_peer(_origin(), sources=many))["args"]
    assert args.count("--source") == 3


def test_the_fetcher_accepts_the_arguments() -> None:
    parser = argparse.ArgumentParser()
    peercommand.add_arguments(parser)
    parsed = parser.parse_args(_main(_peer(_origin()))["args"])
    assert parsed.dest == "/mnt/models"
    assert parsed.source == [f"{n}={e}" for n, e in SOURCES]
    assert (parsed.ca_env, parsed.digest, parsed.max_size) == ("LOCALCACHE_PEER_CA", DIGEST, "1234")
    assert parsed.token_file == "/var/run/secrets/localcache/peer/token"


def _group(*, enabled: bool) -> nodegroup.LocalModelNodeGroup:
    return nodegroup.LocalModelNodeGroup.model_validate(
        {
            "metadata": {"name": "gpu"},
            "spec": {
                "storageLimit": "10Gi",
                "persistentVolumeSpec": {"hostPath": {"path": "/models"}},
                "persistentVolumeClaimSpec": {},
                "peerDistribution": {"enabled": enabled},
            },
        }
    )


def test_an_s3_seed_fetches_two_objects_at_once_unless_the_job_says_otherwise() -> None:
    origin = _origin()
    seed = peerjob.seed_job(origin, _group(enabled=True), URI)
    assert {"name": "S3_MAX_FILE_CONCURRENCY", "value": "2"} in _main(seed)["env"]
    assert origin == _origin()  # not changed in place
    assert peerjob.seed_job(origin, _group(enabled=False), URI) == origin
    assert peerjob.seed_job(origin, _group(enabled=True), "gs://b/m") == origin
    _main(origin)["env"].append({"name": "S3_MAX_FILE_CONCURRENCY", "value": "8"})
    kept = peerjob.seed_job(origin, _group(enabled=True), URI)
    assert [e for e in _main(kept)["env"] if e["name"] == "S3_MAX_FILE_CONCURRENCY"] == [
        {"name": "S3_MAX_FILE_CONCURRENCY", "value": "8"}
    ]


def test_a_seed_of_a_storage_container_with_its_own_container_name_is_tuned_too() -> None:
    origin = _origin()
    _main(origin)["name"] = "custom-initializer"
    seed = peerjob.seed_job(origin, _group(enabled=True), URI)
    assert {"name": "S3_MAX_FILE_CONCURRENCY", "value": "2"} in _main(seed)["env"]
    two = copy.deepcopy(origin)
    two["spec"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "x"})
    assert peerjob.seed_job(two, _group(enabled=True), URI) == two


def test_with_the_peer_image_a_seed_first_records_the_origins_checksums() -> None:
    origin = _origin()
    seed = peerjob.seed_job(origin, _group(enabled=True), URI, image=IMAGE)
    main, pod = _main(seed), seed["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    assert seed["metadata"]["labels"][peerjob.SUMS_LABEL] == "true"
    assert init["name"] == peerjob.SUMS_CONTAINER
    assert init["image"] == IMAGE
    assert init["command"] == ["localcache", "origin-sums"]
    assert init["args"] == [URI, jobs.MOUNT_PATH, "--sidecar"]
    assert init["restartPolicy"] == "Always"  # a sidecar: beside the download, not before it
    assert init["resources"] == peerjob.SUMS_RESOURCES  # not the storage initializer's again
    # the download's credentials, staging mount and identity: it asks the origin as the
    # storage initializer will, and writes into the same folder as the same user
    for field in ("env", "volumeMounts", "securityContext"):
        assert init[field] == main[field], field
    assert {"name": "creds", "mountPath": "/var/secret", "readOnly": True} in init["volumeMounts"]
    assert init["securityContext"]["runAsUser"] == 1001
    assert pod["containers"] == [main]  # the download itself is the storage initializer's
    assert origin == _origin()  # not changed in place


def test_a_seeds_pod_waits_for_the_sidecars_answer_before_it_ends() -> None:
    """The sidecar holds SIGTERM until it has asked the origin (`--deadline`): the pod's grace
    covers that, so the Job completes with the record in the folder (CI at 8a771cb)."""
    seed = peerjob.seed_job(_origin(), _group(enabled=True), URI, image=IMAGE)
    grace = seed["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == peerjob.SEED_GRACE_S > seedsums.DEADLINE_S
    longer = _origin()
    longer["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 600
    kept = peerjob.seed_job(longer, _group(enabled=True), URI, image=IMAGE)
    assert kept["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 600
    plain = peerjob.seed_job(_origin(), _group(enabled=True), URI)  # no sidecar
    assert "terminationGracePeriodSeconds" not in plain["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("image", "enabled", "uri"),
    [("", True, URI), (IMAGE, False, URI), (IMAGE, True, "gs://b/m"), (IMAGE, True, "hf://o/m")],
)
def test_no_checksum_step_without_the_image_peer_distribution_or_an_s3_model(
    image: str, enabled: bool, uri: str
) -> None:
    seed = peerjob.seed_job(_origin(), _group(enabled=enabled), uri, image=image)
    assert "initContainers" not in seed["spec"]["template"]["spec"]
    assert "terminationGracePeriodSeconds" not in seed["spec"]["template"]["spec"]
    assert peerjob.SUMS_LABEL not in seed["metadata"]["labels"]


def test_a_peer_job_that_proves_access_keeps_the_origin_jobs_credentials() -> None:
    origin = _origin()
    job = _peer(origin, prove_uri=URI)
    main, pod = _main(job), job["spec"]["template"]["spec"]
    env = {e["name"]: e for e in main["env"]}
    assert env["AWS_ACCESS_KEY_ID"] == INJECTION.env[0]
    assert env["S3_ENDPOINT"] == INJECTION.env[1]
    assert [v["name"] for v in pod["volumes"]] == [
        "kserve-pvc-source", "creds", "localcache-peer-token"
    ]  # fmt: skip
    assert {"name": "creds", "mountPath": "/var/secret", "readOnly": True} in main["volumeMounts"]
    args = main["args"]
    assert args[args.index("--prove-s3") + 1] == URI
    assert "--prove-s3" not in _main(_peer(origin))["args"]


@pytest.mark.parametrize(
    ("uri", "injected", "resumes"),
    [
        ("https://models.example/m/model.bin", False, True),
        ("https://models.example/m/model.bin", True, False),  # read with credentials
        ("https://models.example/m/model.tar.gz", False, False),  # the origin Job unpacks it
        ("s3://mybucket/mymodel", False, False),
    ],
)
def test_only_an_http_model_read_without_credentials_is_finished_from_the_origin(
    uri: str, injected: bool, resumes: bool
) -> None:
    injection = dataclasses.replace(INJECTION, uri=uri) if injected else credentials.Injection(uri)
    args = _main(_peer(_origin(injection), injection=injection))["args"]
    parser = argparse.ArgumentParser()
    peercommand.add_arguments(parser)
    assert parser.parse_args(args).resume_origin == (uri if resumes else None)


def test_a_cluster_storage_containers_job_becomes_a_peer_job_with_our_container_name() -> None:
    """A ClusterStorageContainer keeps its container's own name in the origin Job: the peer
    Job's one container is still found (the agent crashed on it) and named ours, so that its
    pod's report is read."""
    origin = _origin()
    _main(origin)["name"] = "localcache-download"
    job = _peer(origin)
    [main] = job["spec"]["template"]["spec"]["containers"]
    assert main["name"] == peerjob.CONTAINER
    assert main["command"] == list(peerjob.COMMAND)
    assert main["image"] == IMAGE


def test_only_an_s3_origin_copy_without_the_sidecar_is_unchecked() -> None:
    origin, seed = _origin(), peerjob.seed_job(_origin(), _group(enabled=True), URI, image=IMAGE)
    assert peerjob.unchecked_origin(origin, URI)  # peers off at launch, a fallback's, no image
    assert not peerjob.unchecked_origin(seed, URI)  # its record decides
    assert not peerjob.unchecked_origin(_peer(origin), URI)  # verified against its source
    assert not peerjob.unchecked_origin(origin, "hf://o/m")  # its own check, in the folder
