"""How long each download unit has waited, and for which seed (the planner's clock inputs).

`SeedWaits` (one per agent, on the injected monotonic clock's readings), per unit key
(storage key, scope, node group):
- `request_fields(key, now)`: `waited_s` (since the unit began waiting: the settling time
  and `peerplan.SEED_MAX_WAIT_S`) and a `peerplan.SeedClock` of the seed it waited for last
  (since it was first awaited; since its entry last moved; its last progress and the most
  bytes seen of that progress's Job) for `peerplan.Request`;
- `waiting(key, decision, now)`: the unit waits (`peerplan.WaitForSeed`); returns when it
  began waiting. Another seed starts the seed's clocks again; a move of the same seed
  (`peerplan.SeedProgress.moved_from`: another Job, Downloaded, more bytes than ever seen of
  its Job) starts only the `idle_s` clock again;
- `done(key)`: the unit stopped waiting (it launched, or peer distribution no longer
  decides its Job);
- `prune(now, horizon_s)`: forgets units not looked at for `horizon_s` (a unit whose entry
  went away never calls `done`).
"""

from __future__ import annotations

from dataclasses import dataclass

from localcache.agent import peerplan

Key = tuple[str, str, str]


@dataclass(slots=True)
class _Wait:
    began: float
    seen: float
    seed: str = ""
    elected: float = 0.0
    moved: float = 0.0
    last: peerplan.SeedProgress | None = None
    most: int = 0


class SeedWaits:
    """The waits of one agent's units (module doc)."""

    def __init__(self) -> None:
        self._waits: dict[Key, _Wait] = {}

    def request_fields(self, key: Key, now: float) -> tuple[float, peerplan.SeedClock]:
        wait = self._waits.get(key)
        if wait is None:
            return 0.0, peerplan.SeedClock()
        wait.seen = now
        clock = peerplan.SeedClock(
            wait.seed, now - wait.elected, now - wait.moved, wait.last, wait.most
        )
        return now - wait.began, clock

    def waiting(self, key: Key, decision: peerplan.WaitForSeed, now: float) -> float:
        wait = self._waits.setdefault(key, _Wait(began=now, seen=now))
        progress = decision.progress
        if wait.seed != decision.node:
            wait.seed, wait.elected, wait.moved, wait.last, wait.most = (
                decision.node, now, now, None, 0,
            )  # fmt: skip
        if progress is not None:
            if progress.moved_from(wait.last, wait.most):
                wait.moved = now
            same_job = wait.last is not None and wait.last.job == progress.job
            wait.most = max(wait.most, progress.bytes) if same_job else progress.bytes
            wait.last = progress
        return wait.began

    def done(self, key: Key) -> None:
        self._waits.pop(key, None)

    def prune(self, now: float, horizon_s: float) -> None:
        self._waits = {k: w for k, w in self._waits.items() if now - w.seen < horizon_s}
