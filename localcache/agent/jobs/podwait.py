"""Why a running download Job's pod has not started: read from its pods, at most once per
`RECHECK_S` per Job, and only once the Job is `AFTER_S` old (a pod pulling its image is on its
way). For the model's progress message: a download that waits for ever on an image it cannot
pull or a Secret it cannot find says so, instead of staying Pending without a word.

`PodWaits(api, clock).message(ref, now)`: `caching.jobfailures.pod_waiting_message` of the
Job's pods ("" while it is younger than `AFTER_S`, when its pods are on their way, or when
they cannot be listed); the answer is kept per Job uid (at most `KEPT` Jobs) for `RECHECK_S`.
"""

from __future__ import annotations

import datetime
from typing import Final

from localcache.agent import downloads, jobstate
from localcache.agent.jobs import launcher
from localcache.caching import jobfailures
from localcache.runtime import clock as clock_mod

AFTER_S: Final = 20.0
RECHECK_S: Final = 30.0
KEPT: Final = 256


class PodWaits:
    """See the module docstring."""

    def __init__(self, api: launcher.Api, clock: clock_mod.Clock) -> None:
        self._api, self._clock = api, clock
        self._said: dict[str, tuple[float, str]] = {}

    async def message(self, ref: downloads.JobRef, now: datetime.datetime) -> str:
        created = jobstate.parse_time((ref.obj.get("metadata") or {}).get("creationTimestamp"))
        if created is None or (now - created).total_seconds() < AFTER_S:
            return ""
        at = self._clock.now()
        kept = self._said.get(ref.uid)
        if kept is not None and at - kept[0] < RECHECK_S:
            return kept[1]
        pods = await launcher.job_pods(self._api, ref)
        said = jobfailures.pod_waiting_message(pods or [], job_uid=ref.uid)
        self._said.pop(ref.uid, None)
        self._said[ref.uid] = (at, said)
        while len(self._said) > KEPT:
            self._said.pop(next(iter(self._said)))
        return said
