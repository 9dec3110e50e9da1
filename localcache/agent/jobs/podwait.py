"""Why a running download Job's pod has not started, for the model's progress message: a
download that waits for ever on an image it cannot pull or a Secret it cannot find says so,
instead of staying Pending without a word.

`PodWaits(api, clock, node_name).message(ref, now)`: `caching.jobfailures.pod_waiting_message`
of the Job's pods ("" while the Job is younger than `AFTER_S`, a pod pulling its image being
on its way, and when its pods are on their way). The pods of this node's download Jobs are
listed once per namespace per `RECHECK_S` (by the node label every download pod carries), so
a bad image that stops every Job of a node costs one LIST per namespace, not one per Job; a
LIST that fails keeps the last answer. `detail=False` (a Job in a tenant's namespace, where
the tenant can make a pod that claims the Job as its controller and name any image, which the
kubelet's message quotes): only the reason, a word of a fixed set.
"""

from __future__ import annotations

import datetime
from typing import Any, Final

import structlog

from localcache.agent import downloads, jobstate
from localcache.agent.jobs import jobs, launcher
from localcache.caching import jobfailures
from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, kube

log = structlog.get_logger(__name__)

AFTER_S: Final = 20.0
RECHECK_S: Final = 30.0
KEPT_NAMESPACES: Final = 64

Obj = dict[str, Any]


class PodWaits:
    """See the module docstring."""

    def __init__(self, api: launcher.Api, clock: clock_mod.Clock, node_name: str) -> None:
        self._api, self._clock = api, clock
        self._selector = f"{jobs.LABEL_NODE}={jobs.label_value(node_name)}"
        self._listed: dict[str, tuple[float, list[Obj]]] = {}

    async def message(
        self, ref: downloads.JobRef, now: datetime.datetime, *, detail: bool = True
    ) -> str:
        created = jobstate.parse_time((ref.obj.get("metadata") or {}).get("creationTimestamp"))
        if created is None or (now - created).total_seconds() < AFTER_S:
            return ""
        pods = await self._pods(ref.namespace)
        return jobfailures.pod_waiting_message(pods, job_uid=ref.uid, detail=detail)

    async def _pods(self, namespace: str) -> list[Obj]:
        at, kept = self._clock.now(), self._listed.get(namespace)
        if kept is not None and at - kept[0] < RECHECK_S:
            return kept[1]
        try:
            listed = await self._api.list(
                kube.PODS, namespace=namespace, label_selector=self._selector
            )
        except errors.ApiError as exc:
            log.warning("pods_not_read", namespace=namespace, error=str(exc))
            return kept[1] if kept is not None else []
        self._listed.pop(namespace, None)
        self._listed[namespace] = (at, listed.items)
        while len(self._listed) > KEPT_NAMESPACES:
            self._listed.pop(next(iter(self._listed)))
        return listed.items
