"""The local Job runner's pure parts (localcache/devenv/jobpods.py): which download pods it
runs for the demo nodes and where their files go. No network, no processes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from localcache.devenv import jobpods

Obj = dict[str, Any]

# ------------------------------------------------------------------ the local Job runner


def _pod(**changes: Any) -> Obj:
    pod: Obj = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "ownerReferences": [{"kind": "Job", "name": "j"}],
        },
        "spec": {
            "nodeSelector": {jobpods.HOSTNAME_LABEL: "n1"},
            "containers": [
                {
                    "name": "dl",
                    "image": "img",
                    "args": ["file:///m", "/mnt/models"],
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {}}],
                    "volumeMounts": [
                        {"name": "other", "mountPath": "/mnt"},
                        {"name": "src", "mountPath": "/mnt/models", "subPath": ".staging/k-j"},
                    ],
                }
            ],
            "volumes": [
                {"name": "src", "persistentVolumeClaim": {"claimName": "c"}},
                {"name": "other", "emptyDir": {}},
            ],
        },
        "status": {"phase": "Pending"},
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        pod[section][field] = value
    return pod


NODES = {"n1": Path("/host/n1")}


def test_a_pending_job_pod_pinned_to_a_played_node_is_run() -> None:
    assert jobpods.target_node(_pod(), NODES) == "n1"
    assert jobpods.target_node(_pod(spec__nodeName="n1"), NODES) == "n1"


@pytest.mark.parametrize(
    "changes",
    [
        {"spec__nodeSelector": {jobpods.HOSTNAME_LABEL: "n2"}},
        {"spec__nodeSelector": {}},
        {"spec__nodeName": "n2"},
        {"status__phase": "Running"},
        {"status__phase": "Succeeded"},
        {"metadata__deletionTimestamp": "2030-01-01T00:00:00Z"},
        {"metadata__ownerReferences": [{"kind": "ReplicaSet", "name": "r"}]},
    ],
)
def test_other_pods_are_left_alone(changes: dict[str, Any]) -> None:
    assert jobpods.target_node(_pod(**changes), NODES) is None


def test_the_plan_follows_the_mount_that_holds_the_destination() -> None:
    plan = jobpods.plan_download(_pod())
    assert (plan.uri, plan.claim, plan.sub_path, plan.relative) == (
        "file:///m",
        "c",
        ".staging/k-j",
        "",
    )
    assert (plan.container, plan.image, plan.env) == ("dl", "img", (("A", "1"),))


def test_a_destination_below_the_mount_keeps_its_rest() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["args"] = ["s3://b/m", "/mnt/models/sub/dir"]
    assert jobpods.plan_download(pod).relative == "sub/dir"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["only-uri"], "expected args"),
        (["u", "/elsewhere"], "no volume mount holds /elsewhere"),
        (["u", "/mnt/x"], "'other' is not a PersistentVolumeClaim"),
    ],
)
def test_a_pod_that_cannot_be_planned_says_why(args: list[str], error: str) -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["args"] = args
    with pytest.raises(jobpods.PodError, match=error):
        jobpods.plan_download(pod)


def _pv(path: str, kind: str = "local") -> Obj:
    return {"metadata": {"name": "pv"}, "spec": {kind: {"path": path}}}


def test_the_host_destination_is_the_node_folder_plus_subpath() -> None:
    plan = jobpods.plan_download(_pod())
    dest = jobpods.host_destination(
        plan, _pv("/mnt/models"), host_root=Path("/host/n1"), pv_path="/mnt/models/"
    )
    assert dest == Path("/host/n1/.staging/k-j")
    assert jobpods.host_destination(plan, _pv("/any", "hostPath"), host_root=Path("/h")) == Path(
        "/h/.staging/k-j"
    )


def test_a_pv_elsewhere_than_the_node_volume_is_refused() -> None:
    plan = jobpods.plan_download(_pod())
    with pytest.raises(jobpods.PodError, match="not the node's local volume"):
        jobpods.host_destination(plan, _pv("/other"), host_root=Path("/h"), pv_path="/mnt")
    with pytest.raises(jobpods.PodError, match="not a local, hostPath or localcache volume"):
        jobpods.host_destination(plan, {"spec": {"nfs": {}}}, host_root=Path("/h"))


@pytest.mark.parametrize("sub_path", ["../escape", "/abs", "a/../../b"])
def test_a_subpath_cannot_leave_the_volume(sub_path: str) -> None:
    plan = dataclasses.replace(jobpods.plan_download(_pod()), sub_path=sub_path)
    with pytest.raises(jobpods.PodError, match="leaves the volume"):
        jobpods.host_destination(plan, _pv("/p"), host_root=Path("/h"))


def test_finished_status_reports_success_and_failure() -> None:
    stamps = {"started_at": "t0", "finished_at": "t1"}
    ok = jobpods.finished_status(container="c", image="i", exit_code=0, message="", **stamps)
    assert ok["status"]["phase"] == "Succeeded"
    terminated = ok["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    bad = jobpods.finished_status(
        container="c", image="i", exit_code=2, message="line one\nno such file\n", **stamps
    )
    assert (bad["status"]["phase"], bad["status"]["message"]) == ("Failed", "no such file")
    terminated = bad["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (2, "Error")
    assert "no such file" in terminated["message"]
