"""Why a running download Job's pod has not started (`agent.jobs.podwait`): asked only of a Job
old enough, one LIST per namespace per `RECHECK_S`; in a tenant's namespace, the reason only."""

from __future__ import annotations

import datetime
from typing import Any

from localcache.agent import downloads
from localcache.agent.jobs import podwait
from localcache.runtime import clock, errors, kube

CREATED = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
OLD = CREATED + datetime.timedelta(seconds=podwait.AFTER_S)
IMAGE = "kserve/storage-initializer:v1"
PULL = {"reason": "ErrImagePull", "message": "no such host"}


def _pod(uid: str, image: str = IMAGE, waiting: dict[str, str] = PULL) -> dict[str, Any]:
    return {
        "metadata": {"ownerReferences": [{"controller": True, "uid": uid}]},
        "spec": {"containers": [{"name": "d", "image": image}]},
        "status": {
            "phase": "Pending",
            "containerStatuses": [{"name": "d", "state": {"waiting": waiting}}],
        },
    }


class Pods:
    """The pods API: answers `pods`, counts its LISTs, fails while `down`."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods, self.lists, self.down = list(pods), 0, False
        self.selectors: list[str | None] = []

    async def list(self, res: kube.Resource, **kw: Any) -> kube.ObjList:
        self.lists += 1
        self.selectors.append(kw.get("label_selector"))
        if self.down:
            raise errors.ApiError(503, "down", reason="ServiceUnavailable")
        return kube.ObjList(items=self.pods, resource_version="1")


def _job(uid: str = "u1") -> downloads.JobRef:
    meta = {
        "name": uid,
        "namespace": "jobs",
        "uid": uid,
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    spec = {"template": {"spec": {"containers": [{"name": "d", "image": IMAGE}]}}}
    return downloads.JobRef("jobs", uid, uid, "m", "k", "s", 0, {"metadata": meta, "spec": spec})


async def test_a_young_job_is_not_asked_and_a_namespace_is_listed_once_per_recheck() -> None:
    pods, fake = (
        Pods(_pod("u1"), _pod("u2", waiting={"reason": "ContainerCreating"})),
        clock.FakeClock(),
    )
    waits = podwait.PodWaits(pods, fake, "node-a")  # type: ignore[arg-type]
    young = CREATED + datetime.timedelta(seconds=podwait.AFTER_S - 1)
    assert await waits.message(_job(), young) == ""
    assert pods.lists == 0
    assert await waits.message(_job("u1"), OLD) == "ErrImagePull: no such host"
    assert await waits.message(_job("u2"), OLD) == ""  # on its way
    assert pods.lists == 1
    assert pods.selectors == ["node=node-a"]
    pods.pods = [_pod("u1", waiting={"reason": "ContainerCreating"})]  # it got over it
    assert await waits.message(_job("u1"), OLD) == "ErrImagePull: no such host"  # kept
    await fake.advance(podwait.RECHECK_S)
    assert await waits.message(_job("u1"), OLD) == ""
    assert pods.lists == 2


async def test_a_failed_list_keeps_the_last_answer() -> None:
    pods, fake = Pods(_pod("u1")), clock.FakeClock()
    waits = podwait.PodWaits(pods, fake, "node-a")  # type: ignore[arg-type]
    assert await waits.message(_job(), OLD) == "ErrImagePull: no such host"
    pods.down = True
    await fake.advance(podwait.RECHECK_S)
    assert await waits.message(_job(), OLD) == "ErrImagePull: no such host"


async def test_a_job_in_a_tenants_namespace_gets_the_reason_only() -> None:
    """There, a tenant can make a pod that claims the Job as its controller and name any
    image, which the kubelet's message would quote into the LocalModelNode's status."""
    forged = _pod("u1", image="say-anything/to-the-cluster:0")
    forged["status"]["containerStatuses"][0]["state"]["waiting"] = {
        "reason": "ErrImagePull",
        "message": 'pulling "say-anything/to-the-cluster:0"',
    }
    waits = podwait.PodWaits(Pods(forged), clock.FakeClock(), "node-a")  # type: ignore[arg-type]
    assert await waits.message(_job(), OLD, detail=False) == "ErrImagePull"
