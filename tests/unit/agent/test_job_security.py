"""Issue 13 bug 4: a download pod runs as the agent's uid, so the agent owns (and can later
delete) every file the pod writes."""

from __future__ import annotations

from typing import Any

from localcache.agent.jobs import jobs
from localcache.api import modelnode, nodegroup
from localcache.caching import config, credentials, downloadcontainer, keys

URI = "s3://mybucket/mymodel"
AGENT_UID = 65532


def _job(*, run_as_user: int | None, container: dict[str, Any] | None = None) -> dict[str, Any]:
    group = nodegroup.LocalModelNodeGroup.model_validate(
        {
            "metadata": {"name": "gpu"},
            "spec": {
                "storageLimit": "10Gi",
                "persistentVolumeSpec": {
                    "hostPath": {"path": "/models"},
                    "capacity": {"storage": "10Gi"},
                },
                "persistentVolumeClaimSpec": {"resources": {"requests": {"storage": "10Gi"}}},
            },
        }
    )
    return jobs.build_job(
        entry=modelnode.LocalModelInfo.model_validate(
            {"sourceModelUri": URI, "modelName": "iris", "nodeGroup": "gpu"}
        ),
        node=modelnode.LocalModelNode.model_validate(
            {"metadata": {"name": "node-1", "uid": "u"}, "spec": {"localModels": []}}
        ),
        node_group=group,
        storage_key=keys.storage_key(URI),
        attempt=0,
        container=container
        or downloadcontainer.select_container(URI, [], config.StorageInitializerConfig()),
        injection=credentials.Injection(uri=URI),
        local_model=config.LocalModelConfig(),
        suffix="abcd1234",
        run_as_user=run_as_user,
    )


def _pod(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def test_download_pod_runs_as_the_agents_uid_with_the_download_group() -> None:
    pod = _pod(_job(run_as_user=AGENT_UID))
    assert pod["securityContext"] == {
        "fsGroup": 1000,
        "runAsUser": AGENT_UID,
        "runAsGroup": 1000,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = pod["containers"]
    assert {"name": "HOME", "value": "/tmp"} in container["env"]
    assert container["securityContext"] == {
        **jobs.RESTRICTED_CONTAINER,
        "runAsUser": AGENT_UID,
        "runAsGroup": 1000,
        "runAsNonRoot": True,
    }


def test_a_home_the_container_sets_is_kept() -> None:
    container = {"name": "c", "image": "i", "env": [{"name": "HOME", "value": "/home/x"}]}
    (main,) = _pod(_job(run_as_user=AGENT_UID, container=container))["containers"]
    assert [e for e in main["env"] if e["name"] == "HOME"] == [{"name": "HOME", "value": "/home/x"}]


def test_a_root_agent_does_not_make_download_pods_run_as_root() -> None:
    pod = _pod(_job(run_as_user=None))
    assert pod["securityContext"] == {"fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
    assert "HOME" not in {e["name"] for e in pod["containers"][0].get("env") or []}


def test_a_storage_containers_own_user_does_not_win_over_the_agents() -> None:
    """KServe's storage initializer image runs as uid 1000; a ClusterStorageContainer may pin
    that in its container: the download still writes as the agent's uid."""
    container = {
        "name": "c",
        "image": "i",
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "readOnlyRootFilesystem": True},
    }
    (main,) = _pod(_job(run_as_user=AGENT_UID, container=container))["containers"]
    assert main["securityContext"] == {
        "runAsUser": AGENT_UID,
        "runAsGroup": 1000,
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        **jobs.RESTRICTED_CONTAINER,
    }


def test_a_storage_container_asking_for_privileges_is_made_restricted() -> None:
    """Pod Security `restricted` in the job namespace (security review finding 7)."""
    container = {
        "name": "c",
        "image": "i",
        "securityContext": {
            "privileged": True,
            "allowPrivilegeEscalation": True,
            "capabilities": {"add": ["SYS_ADMIN"]},
        },
    }
    (main,) = _pod(_job(run_as_user=AGENT_UID, container=container))["containers"]
    assert main["securityContext"]["privileged"] is False
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}
