"""The I/O helpers of import Jobs against a fake API: progress, own image, Job shape/keys."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.caching import importjob
from localcache.controllers import importjobs
from localcache.runtime import errors, kube
from localcache.runtime.keys import ObjectKey

Obj = dict[str, Any]


class FakeApi:
    def __init__(self, pods: list[Obj], log: str = "", own_pod: Obj | None = None) -> None:
        self.pods = pods
        self.log = log
        self.own_pod = own_pod
        self.log_calls: list[dict[str, Any]] = []
        self.gets = 0
        self.deleted: list[tuple[str, str | None]] = []

    async def delete(self, res: kube.Resource, name: str, **kwargs: Any) -> Obj:
        assert res == kube.JOBS
        self.deleted.append((name, kwargs.get("uid")))
        return {}

    async def list(self, res: kube.Resource, **kwargs: Any) -> kube.ObjList:
        assert res == kube.PODS
        return kube.ObjList(items=self.pods, resource_version="1")

    async def pod_log(self, name: str, **kwargs: Any) -> str:
        self.log_calls.append({"name": name, **kwargs})
        return self.log

    async def get(self, res: kube.Resource, name: str, *, namespace: str | None = None) -> Obj:
        self.gets += 1
        if self.own_pod is None:
            raise errors.NotFound(404, "gone", reason="NotFound")
        return self.own_pod


def _pod(name: str, owner: str, *, sidecar: str = "running") -> Obj:
    """An import pod as the kubelet reports it while downloading: phase Pending (the
    download and the progress sidecar are init containers), the sidecar in state `sidecar`."""
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": name,
            "ownerReferences": [{"kind": "Job", "uid": owner, "controller": True}],
        },
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [
                {"name": importjob.PREPARE_CONTAINER, "state": {"terminated": {"exitCode": 0}}},
                {"name": importjob.PROGRESS_CONTAINER, "state": {sidecar: {}}},
            ],
        },
    }


async def test_progress_reads_one_bounded_line_of_our_running_pod_only() -> None:
    api = FakeApi([_pod("a", "forged"), _pod("b", "job-1")], log='{"bytes": 77, "files": 1}\n')
    progress = importjobs.Progress(api, interval=3600)  # type: ignore[arg-type]
    assert await progress.bytes("cache-1", namespace="team", job_uid="job-1") == 77
    assert api.log_calls == [
        {
            "name": "b",
            "namespace": "team",
            "container": importjob.PROGRESS_CONTAINER,
            "tail_lines": 1,
            "limit_bytes": importjobs.LOG_LIMIT,
            "request_timeout": importjobs.LOG_TIMEOUT,
        }
    ]
    api.log = '{"bytes": 99, "files": 1}'
    assert await progress.bytes("cache-1", namespace="team", job_uid="job-1") == 77
    assert len(api.log_calls) == 1, "read at most once per interval per cache"


async def test_progress_ignores_other_jobs_pods_and_garbage() -> None:
    api = FakeApi([_pod("a", "forged")], log='{"bytes": 5, "files": 1}')
    progress = importjobs.Progress(api, interval=0)  # type: ignore[arg-type]
    assert await progress.bytes("c", namespace="team", job_uid="job-1") is None
    assert api.log_calls == []
    api.pods = [_pod("b", "job-1", sidecar="waiting")]
    assert await progress.bytes("c", namespace="team", job_uid="job-1") is None
    assert api.log_calls == [], "no log is asked of a sidecar that does not run"
    api.pods = [_pod("b", "job-1")]
    api.log = "not json " * 100
    assert await progress.bytes("c", namespace="team", job_uid="job-1") is None


async def test_the_import_image_is_the_setting_else_the_controllers_own() -> None:
    pod = {"spec": {"containers": [{"name": "sidecar", "image": "s:1"},
                                   {"name": "manager", "image": "localcache:9"}]}}  # fmt: skip
    api = FakeApi([], own_pod=pod)
    given = importjobs.ImageSource(api, image="mine:1", pod=ObjectKey("kserve", "p"))  # type: ignore[arg-type]
    assert await given.image() == "mine:1"
    assert api.gets == 0
    own = importjobs.ImageSource(api, pod=ObjectKey("kserve", "p"))  # type: ignore[arg-type]
    assert await own.image() == "localcache:9"
    assert await own.image() == "localcache:9"
    assert api.gets == 1, "read once"
    nowhere = importjobs.ImageSource(FakeApi([]), pod=ObjectKey("kserve", "p"))  # type: ignore[arg-type]
    assert await nowhere.image() == ""


def test_the_job_store_keeps_little_of_a_job() -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "m-import",
            "namespace": "team",
            "uid": "j",
            "labels": {"model": "m", "modelNamespace": "team", "junk": "x" * 5000},
            "annotations": {importjob.ANNOTATION_PVC_UID: "c", "junk": "y" * 5000},
            "ownerReferences": [
                {"kind": "LocalModelNamespaceCache", "name": "m", "uid": "u", "controller": True}
            ],
        },
        "spec": {"template": {"spec": {"containers": [{"name": "x", "image": "z" * 5000}]}}},
        "status": {
            "active": 1,
            "conditions": [{"type": "Failed", "status": "True", "message": "m" * 5000}],
        },
    }
    kept = importjobs.observed_job(job)
    assert "spec" not in kept
    assert kept["metadata"]["labels"] == {"model": "m"}
    assert kept["metadata"]["annotations"] == {importjob.ANNOTATION_PVC_UID: "c"}
    assert kept["metadata"]["ownerReferences"][0]["controller"] is True
    assert kept["status"] == {"conditions": [{"type": "Failed", "status": "True"}], "active": 1}
    assert importjobs.job_keys(kept) == [ObjectKey("team", "m")]


@pytest.mark.parametrize(
    ("labels", "name", "want"),
    [
        ({}, "a-import", ["a"]),
        ({"model": "b"}, "a-import", ["a", "b"]),
        ({}, "plain", ["plain"]),
    ],
)
def test_a_job_event_concerns_the_caches_it_may_belong_to(
    labels: dict[str, str], name: str, want: list[str]
) -> None:
    job = {"metadata": {"name": name, "namespace": "team", "labels": labels}}
    assert importjobs.job_keys(job) == [ObjectKey("team", n) for n in want]


def _job(uid: str, condition: str | None = None) -> Obj:
    conditions = [{"type": condition, "status": "True"}] if condition else []
    return {
        "metadata": {"name": "m-import", "namespace": "team", "uid": uid},
        "status": {"conditions": conditions, "active": 0 if condition else 1},
    }


async def test_a_cache_that_lost_its_destination_stops_only_its_own_unfinished_job() -> None:
    api = FakeApi([])
    stop = importjobs.stop_unfinished
    await stop(api, _job("theirs"), "ours", why="t")  # type: ignore[arg-type]
    await stop(api, _job("ours", "Complete"), "ours", why="t")  # type: ignore[arg-type]
    await stop(api, _job("ours", "Failed"), "ours", why="t")  # type: ignore[arg-type]
    await stop(api, None, "ours", why="t")  # type: ignore[arg-type]
    assert api.deleted == []
    await stop(api, _job("ours"), "ours", why="t")  # type: ignore[arg-type]
    assert api.deleted == [("m-import", "ours")]


def test_the_record_must_survive_the_served_schema() -> None:
    assert importjobs.record_kept({"sharedVolume": {"claimUID": "c"}}, "c")
    assert not importjobs.record_kept({"conditions": []}, "c")
    assert not importjobs.record_kept({"sharedVolume": {"claimUID": "old"}}, "c")
