"""Peer-mode download Jobs whose pod never starts, and the origin instead.

A peer-mode Job runs the agent's `--peer-image`. When that image cannot be pulled on the node
(an install overlay changed the agent's image with `images:` but not `--peer-image`, say),
its pod waits in ImagePullBackOff for ever, and the stall timeout never counts a pod that is
not running (`agent.stall`): without this, the unit would wait for good.

`StartWatch` (one per agent):
- `check(action, latest, now)`: for a `plan.Report` of the unit's latest Job, a peer-mode Job
  still Pending with nothing written and created (`metadata.creationTimestamp`) `start_s` or
  more before `now` (the pass's wall time; no state, so an agent restart does not start the
  count again) -> a `plan.Stop` of that Job, and the unit (storage key, scope) is marked. Its
  outcome is a stopped download's (`stall.STALLED`, `nextRetryTime` now), so that the next
  attempt is counted as one (`plan._after_stop`). Any other action is returned as it is;
- `take(storage_key, scope)`: whether the unit was marked (the mark is consumed): its next
  Job is the origin's (`Peering.mode` counts and says it, reason `peer-not-started`).
Bounded: at most `KEPT` marks (the oldest go first).
Not promised: telling an image pull from any other reason a pod does not start (scheduling,
a quota): after `start_s` the origin is the better bet in every case.

A seed's origin Job with the checksum sidecar (`peerjob.seed_job`), which runs the same image,
is stopped alike once its pod says it cannot start (`plan.NOT_STARTED`: an image that cannot
be pulled, not one still pulling) and the unit is marked: its next Job is the plain origin
Job (no sidecar), so an unpullable `--peer-image` never holds an origin download (its copy is
then served to no peer: `peerjob.unchecked_origin`).
"""

from __future__ import annotations

import datetime
from typing import Final

from localcache.agent import downloads, jobstate, plan, stall, status
from localcache.agent.jobs import peerjob
from localcache.api import modelnode
from localcache.runtime import clock as clock_mod

START_S: Final = 120.0
KEPT: Final = 256


class StartWatch:
    """Peer-mode Jobs that never start (module doc)."""

    def __init__(self, *, start_s: float = START_S) -> None:
        self._start_s = start_s
        self._marked: dict[tuple[str, str], None] = {}

    def check(
        self, action: plan.Action, latest: downloads.JobRef | None, now: datetime.datetime
    ) -> plan.Action:
        if not isinstance(action, plan.Report) or latest is None:
            return action
        progress = action.outcome.progress
        pending = action.outcome.status is modelnode.ModelStatus.DOWNLOAD_PENDING
        if not pending or progress.bytes_on_disk:
            return action
        peer = peerjob.is_peer(latest.obj)
        stuck = (progress.message or "").startswith(plan.NOT_STARTED)  # not a slow image pull
        if not peer and not (peerjob.is_seed(latest.obj) and stuck):
            return action
        created = jobstate.parse_time((latest.obj.get("metadata") or {}).get("creationTimestamp"))
        if created is None or (now - created).total_seconds() < self._start_s:
            return action
        self._marked[(latest.storage_key, latest.scope)] = None
        while len(self._marked) > KEPT:
            self._marked.pop(next(iter(self._marked)))
        kind, instead = ("peer-mode download", "") if peer else ("seed", " without its sidecar")
        message = (
            f"{stall.STALLED}: {kind} Job {latest.namespace}/{latest.name} did not start "
            f"within {int(self._start_s)} s; stopped, downloading from the origin{instead}"
        )
        stopped = modelnode.ModelProgress(
            bytes_on_disk=0,
            attempts=latest.attempt + 1,
            job_name=latest.name,
            message=message,
            next_retry_time=clock_mod.rfc3339(now),
        )
        return plan.Stop(
            latest, status.Outcome(modelnode.ModelStatus.DOWNLOAD_PENDING, stopped, 1.0)
        )

    def take(self, storage_key: str, scope: str) -> bool:
        if (storage_key, scope) not in self._marked:
            return False
        del self._marked[(storage_key, scope)]
        return True
