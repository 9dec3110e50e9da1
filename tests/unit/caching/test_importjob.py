"""A shared-volume cache's import Job (issue 22): KServe's Job shape with localcache's staging
and placement containers, and the pod's own reports read defensively."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localcache.api import download, modelcache
from localcache.caching import config, credentials, downloadcontainer, importjob, keys

URI = "s3://bucket/llama"
KEY = keys.storage_key(URI)
CLAIM_UID = "claim-uid-1"
IMAGE = "localcache:dev"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _cache(name: str = "llama", **spec: Any) -> modelcache.LocalModelNamespaceCache:
    return modelcache.LocalModelNamespaceCache.model_validate(
        {
            "metadata": {"name": name, "namespace": "team-a", "uid": "cache-uid"},
            "spec": {"sourceModelUri": URI, "modelSize": "1Gi", "pvcRef": "shared", **spec},
        }
    )


def _job(
    cache: modelcache.LocalModelNamespaceCache | None = None,
    *,
    injection: credentials.Injection | None = None,
    container: dict[str, Any] | None = None,
    local_model: config.LocalModelConfig | None = None,
    layers: tuple[download.DownloadSpec | None, ...] = (),
) -> dict[str, Any]:
    return importjob.build_import_job(
        cache=cache or _cache(),
        claim_uid=CLAIM_UID,
        storage_key=KEY,
        container=container
        or downloadcontainer.select_container(URI, [], config.StorageInitializerConfig()),
        injection=injection or credentials.Injection(uri=URI),
        local_model=local_model or config.LocalModelConfig(),
        image=IMAGE,
        download=layers,
    )


def _pod(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def _containers(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    pod = _pod(job)
    return {c["name"]: c for c in [*pod["initContainers"], *pod["containers"]]}


def test_import_job_name_is_kserves() -> None:
    assert importjob.import_job_name("llama") == "llama-import"
    assert importjob.import_job_name("a" * 56) == "a" * 56 + "-import"  # 63: kept
    long = "m" * 42 + "-" * 5 + "x" * 30
    digest = hashlib.sha256(long.encode()).hexdigest()[:8]
    name = importjob.import_job_name(long)
    assert name == "m" * 42 + f"-{digest}-import"  # cut at 47, trailing '-' stripped
    assert len(importjob.import_job_name("z" * 253)) == 63
    assert importjob.import_job_name("z" * 253) != importjob.import_job_name("z" * 252)


def test_spec_hash_is_kserves_json_of_service_account_and_storage() -> None:
    def go(payload: str) -> str:
        return hashlib.sha256(payload.encode()).hexdigest()

    assert importjob.import_spec_hash(_cache().spec) == go(
        '{"serviceAccountName":"","storage":null}'
    )
    spec = _cache(
        serviceAccountName="puller", storage={"key": "s3<1>", "parameters": {"b": "2", "a": "&"}}
    ).spec
    assert importjob.import_spec_hash(spec) == go(
        '{"serviceAccountName":"puller","storage":{"key":"s3\\u003c1\\u003e",'
        '"parameters":{"a":"\\u0026","b":"2"}}}'
    )
    assert importjob.import_spec_hash(_cache(storage={}).spec) == go(
        '{"serviceAccountName":"","storage":{}}'
    )
    # Only the credential spec counts: the size or the download tuning do not replace a Job.
    assert importjob.import_spec_hash(_cache(modelSize="2Gi").spec) == importjob.import_spec_hash(
        _cache().spec
    )


def test_job_has_kserves_metadata_and_no_ttl_or_node_selector() -> None:
    job = _job()
    meta = job["metadata"]
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    assert (meta["name"], meta["namespace"]) == ("llama-import", "team-a")
    assert meta["annotations"] == {
        "serving.kserve.io/import-pvc-uid": CLAIM_UID,
        "serving.kserve.io/import-storage-key": KEY,
        "serving.kserve.io/import-spec-hash": importjob.import_spec_hash(_cache().spec),
    }
    assert meta["labels"] == {
        "model": "llama",
        "modelNamespace": "team-a",
        importjob.LABEL_IMPORT: "true",
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "serving.kserve.io/v1alpha1",
            "kind": "LocalModelNamespaceCache",
            "name": "llama",
            "uid": "cache-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = job["spec"]
    assert (spec["parallelism"], spec["completions"], spec["backoffLimit"]) == (1, 1, 2)
    assert spec["podReplacementPolicy"] == "Failed"
    assert "ttlSecondsAfterFinished" not in spec
    pod = _pod(job)
    assert "nodeSelector" not in pod
    assert "serviceAccountName" not in pod
    assert pod["restartPolicy"] == "Never"
    assert pod["volumes"] == [
        {"name": "kserve-pvc-source", "persistentVolumeClaim": {"claimName": "shared"}}
    ]
    assert spec["template"]["metadata"]["labels"] == {
        k: v for k, v in meta["labels"].items() if k != importjob.LABEL_IMPORT
    }


def test_long_names_give_valid_labels() -> None:
    job = _job(_cache("n" * 200))
    assert len(job["metadata"]["name"]) == 63
    assert DNS_LABEL.fullmatch(job["metadata"]["name"])
    assert len(job["metadata"]["labels"]["model"]) <= 63


def test_containers_prepare_then_progress_then_download_then_place() -> None:
    job = _job()
    pod = _pod(job)
    assert [c["name"] for c in pod["initContainers"]] == [
        "prepare",
        "progress",
        "kserve-localmodel-download",
    ]
    assert [c["name"] for c in pod["containers"]] == ["place"]
    c = _containers(job)
    claim = [{"name": "kserve-pvc-source", "mountPath": "/mnt/claim", "subPath": "models"}]
    assert c["prepare"]["command"] == [
        "localcache", "import", "prepare", "--models", "/mnt/claim", "--key", KEY,
    ]  # fmt: skip
    assert c["place"]["command"] == [
        "localcache", "import", "place", "--models", "/mnt/claim", "--key", KEY,
    ]  # fmt: skip
    assert c["progress"]["command"] == [
        "localcache", "import", "progress", "--dir", f"/mnt/claim/.localcache-import/{KEY}/data",
    ]  # fmt: skip
    assert c["progress"]["restartPolicy"] == "Always"
    for name in ("prepare", "progress", "place"):
        assert c[name]["image"] == IMAGE
        assert c[name]["volumeMounts"] == claim
        assert c[name]["resources"]["limits"]["memory"]
        assert "restartPolicy" not in c[name] or name == "progress"
    fetch = c["kserve-localmodel-download"]
    assert fetch["args"] == [URI, "/mnt/models"]
    assert fetch["image"] == "kserve/storage-initializer:latest"
    assert fetch["volumeMounts"] == [
        {
            "name": "kserve-pvc-source",
            "mountPath": "/mnt/models",
            "readOnly": False,
            "subPath": f"models/.localcache-import/{KEY}/data",
        }
    ]
    assert fetch["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_pod_is_restricted_and_all_containers_share_one_uid() -> None:
    own = {"privileged": True, "runAsUser": 0, "readOnlyRootFilesystem": True}
    container: dict[str, Any] = {
        "name": "custom",
        "image": "c:1",
        "securityContext": own,
    }
    job = _job(container=container)
    pod = _pod(job)
    assert pod["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsUser": importjob.RUN_AS_USER,
        "runAsNonRoot": True,
    }
    for c in _containers(job).values():
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["privileged"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc.get("runAsUser", importjob.RUN_AS_USER) == importjob.RUN_AS_USER
    fetch = _containers(job)["kserve-localmodel-download"]
    assert fetch["securityContext"]["readOnlyRootFilesystem"] is True  # its own, kept
    assert {"name": "HOME", "value": "/tmp"} in fetch["env"]
    assert own["runAsUser"] == 0  # the template is not changed


def test_fs_group_comes_only_from_the_shared_pvc_key() -> None:
    pod = _pod(_job(local_model=config.LocalModelConfig.model_validate({"fsGroup": 1234})))
    assert "fsGroup" not in pod["securityContext"]
    local = config.LocalModelConfig.model_validate({"sharedPVCImportFSGroup": 4321})
    job = _job(local_model=local)
    assert _pod(job)["securityContext"]["fsGroup"] == 4321
    assert _pod(job)["securityContext"]["runAsGroup"] == 4321
    assert _containers(job)["kserve-localmodel-download"]["securityContext"]["runAsGroup"] == 4321


def test_credentials_are_appended_by_reference_and_the_pod_runs_as_the_account() -> None:
    secret_env = {
        "name": "AWS_SECRET_ACCESS_KEY",
        "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}},
    }
    injection = credentials.Injection(
        uri="s3://bucket/llama-rewritten",
        env=(secret_env,),
        volumes=({"name": "gcs", "secret": {"secretName": "gcs"}},),
        volume_mounts=({"name": "gcs", "mountPath": "/var/secret/gcs", "readOnly": True},),
        service_account_name="puller",
        pod_labels={"azure.workload.identity/use": "true"},
    )
    job = _job(injection=injection)
    pod = _pod(job)
    fetch = _containers(job)["kserve-localmodel-download"]
    assert fetch["args"][0] == "s3://bucket/llama-rewritten"
    assert secret_env in fetch["env"]
    assert [m["name"] for m in fetch["volumeMounts"]] == ["kserve-pvc-source", "gcs"]
    assert [v["name"] for v in pod["volumes"]] == ["kserve-pvc-source", "gcs"]
    assert pod["serviceAccountName"] == "puller"
    assert job["spec"]["template"]["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert "azure.workload.identity/use" not in job["metadata"]["labels"]
    assert "secret" not in json.dumps(_containers(job)["place"])


def test_the_caches_download_applies_tenant_variables_only_and_never_over_credentials() -> None:
    cache = _cache(
        download={
            "env": [
                {"name": "HF_HUB_DISABLE_XET", "value": "1"},
                {"name": "HF_ENDPOINT", "value": "https://evil"},
                {"name": "AWS_SECRET_ACCESS_KEY", "value": "forged"},
            ],
            "resources": {"limits": {"memory": "8Gi"}},
        }
    )
    earlier = download.DownloadSpec.model_validate(
        {"env": [{"name": "HF_HUB_DISABLE_XET", "value": "0"}, {"name": "X_EARLY", "value": "e"}]}
    )
    injection = credentials.Injection(
        uri=URI, env=({"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {}}},)
    )
    fetch = _containers(_job(cache, injection=injection, layers=(earlier,)))[
        "kserve-localmodel-download"
    ]
    env = {e["name"]: e for e in fetch["env"]}
    assert env["HF_HUB_DISABLE_XET"]["value"] == "1"  # the cache's, over the earlier layer
    assert env["X_EARLY"]["value"] == "e"
    assert "HF_ENDPOINT" not in env
    assert env["AWS_SECRET_ACCESS_KEY"] == {
        "name": "AWS_SECRET_ACCESS_KEY",
        "valueFrom": {"secretKeyRef": {}},
    }
    assert [e["name"] for e in fetch["env"]].count("AWS_SECRET_ACCESS_KEY") == 1
    assert fetch["resources"]["limits"]["memory"] == "8Gi"


def test_a_cache_without_pvc_ref_or_uid_or_a_bad_key_is_refused() -> None:
    node_cache = modelcache.LocalModelNamespaceCache.model_validate(
        {
            "metadata": {"name": "n", "namespace": "a", "uid": "u"},
            "spec": {"sourceModelUri": URI, "modelSize": "1Gi", "nodeGroups": ["g"]},
        }
    )
    with pytest.raises(ValueError, match="pvcRef"):
        _job(node_cache)
    no_uid = _cache().model_copy(deep=True)
    no_uid.metadata.uid = None
    with pytest.raises(ValueError, match="uid"):
        _job(no_uid)
    for bad in ("../x", "..", "a/b", "", "k" * 200):
        with pytest.raises(ValueError, match="key"):
            importjob.build_import_job(
                cache=_cache(),
                claim_uid=CLAIM_UID,
                storage_key=bad,
                container={"name": "c"},
                injection=credentials.Injection(uri=URI),
                local_model=config.LocalModelConfig(),
                image=IMAGE,
            )


def test_progress_is_the_last_well_formed_line() -> None:
    log = (
        '{"bytes": 10, "files": 1}\nnoise\n{"bytes": 2048, "files": 3}\n{"bytes": -1, "files": 1}\n'
    )
    assert importjob.progress_from_log(log) == importjob.Progress(bytes=2048, files=3)
    assert importjob.progress_from_log("") is None
    assert importjob.progress_from_log("no json here\n") is None


@pytest.mark.parametrize(
    "line",
    [
        '{"bytes": -1, "files": 0}',
        '{"bytes": 1, "files": -1}',
        '{"bytes": 1e3, "files": 1}',
        '{"bytes": true, "files": 1}',
        '{"bytes": "1", "files": 1}',
        f'{{"bytes": {2**53}, "files": 1}}',
        f'{{"bytes": 1, "files": {10**9 + 1}}}',
        '{"bytes": 1, "files": 1, "extra": 1}',
        '{"bytes": 1}',
        "[1, 2]",
        '{"bytes": 1, "files": 1' + " " * 300 + "}",
    ],
)
def test_garbage_progress_is_refused(line: str) -> None:
    assert importjob.progress_from_log(line) is None
    assert importjob.placed_from_message(line) is None


def test_only_the_logs_tail_is_read() -> None:
    old = '{"bytes": 5, "files": 1}\n'
    assert importjob.progress_from_log(old + "x" * importjob.MAX_LOG_CHARS) is None


def test_placed_is_the_termination_messages_last_line() -> None:
    assert importjob.placed_from_message('{"bytes": 7, "files": 2}\n') == importjob.Progress(7, 2)
    assert importjob.placed_from_message("") is None
    message = "refusing to place an empty download"
    assert importjob.placed_from_message(message) is None
    assert importjob.placed_from_message('{"bytes": 7, "files": 2}\n' + message) is None


@given(st.text(max_size=400))
def test_any_text_parses_or_is_none(text: str) -> None:
    for found in (importjob.progress_from_log(text), importjob.placed_from_message(text)):
        assert found is None or (found.bytes >= 0 and found.files >= 0)
