"""How long a running download has written nothing: per download Job, the bytes (and entries)
its staging folder held when they last grew, and when that was, on the injected clock.

Contract:
- `GrowthWatch.idle(uid, usage, running=...)` answers the seconds since the staging folder of
  the Job `uid` last grew (0.0 when it just grew or is seen for the first time). Growth is
  more bytes or more entries than ever seen for that Job (a download that rewrites a file in
  place without growing it counts as idle).
- The clock starts only once the download runs: a Job whose pod is not ready yet and that
  wrote nothing (image pull, scheduling) is never idle, so a slow start is not a stall.
- A walk that reached its bound (`tree.Usage.truncated`) cannot tell growth: the Job counts
  as growing.
- `retain(uids)` forgets the Jobs no longer running; memory is per process: after an agent
  restart every running download gets a fresh `downloadStallTimeoutInSecs`.
Not promised: precision finer than the agent's progress interval (the folder is measured
when a pass looks at the Job).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from localcache.agent import downloads
from localcache.agent.disk import tree
from localcache.runtime import clock as clock_mod


@dataclass(frozen=True, slots=True)
class _Seen:
    bytes: int
    entries: int
    since: float


class GrowthWatch:
    """Per download Job, when its staging folder last grew (see the module docstring)."""

    def __init__(self, clock: clock_mod.Clock) -> None:
        self._clock = clock
        self._seen: dict[str, _Seen] = {}

    def idle(self, uid: str, usage: tree.Usage, *, running: bool) -> float:
        """Seconds since the staging folder of Job `uid` last grew."""
        now = self._clock.now()
        if not running and usage.bytes == 0 and usage.entries == 0:
            self._seen.pop(uid, None)
            return 0.0
        last = self._seen.get(uid)
        grew = (
            last is None
            or usage.truncated
            or usage.bytes > last.bytes
            or usage.entries > last.entries
        )
        if last is None or grew:
            high = last or _Seen(0, 0, now)
            self._seen[uid] = _Seen(
                max(high.bytes, usage.bytes), max(high.entries, usage.entries), now
            )
            return 0.0
        return max(0.0, now - last.since)

    def retain(self, uids: Iterable[str]) -> None:
        """Forget every Job but these."""
        keep = set(uids)
        for uid in [u for u in self._seen if u not in keep]:
            del self._seen[uid]


STALLED: Final = "DownloadStalled"
"""How a stalled download's message starts (status, the cache's condition, the Event reason)."""
_OVERSIZE: Final = "more than the cache's modelSize"


def stalled_message(job: downloads.JobRef, written: int, idle_s: float, timeout_s: float) -> str:
    """The ModelDownloadError message of a download stopped for writing nothing."""
    return (
        f"{STALLED}: download Job {job.namespace}/{job.name} wrote nothing for {idle_s:.0f} s "
        f"(downloadStallTimeoutInSecs: {timeout_s:g}); stopped at {written} bytes, retrying"
    )


def oversize_message(job: downloads.JobRef, written: int, model_size: int) -> str:
    """The ModelDownloadError message of a download stopped for writing too much."""
    return (
        f"download Job {job.namespace}/{job.name} wrote {written} bytes, {_OVERSIZE} "
        f"({model_size} bytes): stopped and discarded; raise modelSize if the model is that large"
    )


def was_stopped(message: str | None) -> bool:
    """Whether a status message is that of a Job the agent stopped (`plan.Stop`)."""
    if not message:
        return False
    return message.startswith(STALLED) or _OVERSIZE in message
