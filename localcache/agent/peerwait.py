"""How long each download unit has waited, and for which seed (the planner's clock inputs).

`SeedWaits` (one per agent, on the injected monotonic clock's readings), per unit key
(storage key, scope, node group):
- `request_fields(key, now)`: `waited_s` (since the unit began waiting: the settling time)
  and `seed_waited` = (the seed it waited for last, seconds since that seed was first
  awaited, seconds since that seed's entry last changed) for `peerplan.Request`;
- `waiting(key, decision, now)`: the unit waits (`peerplan.WaitForSeed`); returns when it
  began waiting. Another seed, or another `progress` of the same seed, starts its clocks
  again: a seed whose download moves is waited for as long as it moves, and a newly elected
  seed gets its own `seed_start_s`;
- `done(key)`: the unit launched;
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
    changed: float = 0.0
    progress: str = ""


class SeedWaits:
    """The waits of one agent's units (module doc)."""

    def __init__(self) -> None:
        self._waits: dict[Key, _Wait] = {}

    def request_fields(self, key: Key, now: float) -> tuple[float, tuple[str, float, float]]:
        wait = self._waits.get(key)
        if wait is None:
            return 0.0, ("", 0.0, 0.0)
        wait.seen = now
        return now - wait.began, (wait.seed, now - wait.elected, now - wait.changed)

    def waiting(self, key: Key, decision: peerplan.WaitForSeed, now: float) -> float:
        wait = self._waits.setdefault(key, _Wait(began=now, seen=now))
        if wait.seed != decision.node:
            wait.seed, wait.elected = decision.node, now
            wait.changed, wait.progress = now, decision.progress
        elif wait.progress != decision.progress:
            wait.changed, wait.progress = now, decision.progress
        return wait.began

    def done(self, key: Key) -> None:
        self._waits.pop(key, None)

    def prune(self, now: float, horizon_s: float) -> None:
        self._waits = {k: w for k, w in self._waits.items() if now - w.seen < horizon_s}
