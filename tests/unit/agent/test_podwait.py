"""Why a running download Job's pod has not started (`agent.jobs.podwait`): asked only of a Job
old enough, at most once per `RECHECK_S`."""

from __future__ import annotations

import datetime
from typing import Any

from localcache.agent import downloads
from localcache.agent.jobs import podwait
from localcache.runtime import clock, kube

CREATED = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
PULL = {"reason": "ErrImagePull", "message": "no such host"}


class Pods:
    """The pods API: one pod of the Job, waiting as `waiting` says; counts its LISTs."""

    def __init__(self) -> None:
        self.lists = 0
        self.waiting: dict[str, str] = PULL

    async def list(self, res: kube.Resource, **_: Any) -> kube.ObjList:
        self.lists += 1
        pod = {
            "metadata": {"ownerReferences": [{"controller": True, "uid": "u1"}]},
            "status": {
                "phase": "Pending",
                "containerStatuses": [{"name": "d", "state": {"waiting": self.waiting}}],
            },
        }
        return kube.ObjList(items=[pod], resource_version="1")


def _job() -> downloads.JobRef:
    meta = {
        "name": "j",
        "namespace": "jobs",
        "uid": "u1",
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    return downloads.JobRef("jobs", "j", "u1", "m", "k", "s", 0, {"metadata": meta})


async def test_a_young_job_is_not_asked_and_an_old_one_at_most_every_recheck() -> None:
    pods, fake = Pods(), clock.FakeClock()
    waits = podwait.PodWaits(pods, fake)  # type: ignore[arg-type]
    young = CREATED + datetime.timedelta(seconds=podwait.AFTER_S - 1)
    assert await waits.message(_job(), young) == ""
    assert pods.lists == 0
    old = CREATED + datetime.timedelta(seconds=podwait.AFTER_S)
    assert await waits.message(_job(), old) == "ErrImagePull: no such host"
    pods.waiting = {"reason": "ContainerCreating"}  # it got over it
    assert await waits.message(_job(), old) == "ErrImagePull: no such host"  # kept
    assert pods.lists == 1
    await fake.advance(podwait.RECHECK_S)
    assert await waits.message(_job(), old) == ""
    assert pods.lists == 2
