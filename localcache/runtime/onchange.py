"""Log a problem when its state changes, not on every resync.

A level-based reconciler meets the same problem on every pass (a download that cannot start,
a Job the apiserver rejects); logging it each time floods the log with one identical line
per object per resync. `OnChange` remembers the last state reported per key, so the caller
logs only what is new:

    if self._warned.changed(unit.storage_key, message):
        log.warning("download_not_started", storage_key=unit.storage_key, error=message)

Contract:
- `changed(key, state)` is True the first time a key is seen and whenever its state differs
  from the last one reported, and records it.
- `forget(key)` when the problem is gone (the next occurrence is then logged again);
  `retain(keys)` forgets every key not in `keys` (objects that left).
- Bounded: at most `max_keys` keys are kept; past that the key reported longest ago is
  forgotten (and may be logged once more).
Not promised: thread safety (one event loop), or persistence across restarts (a restarted
process logs each current problem once).
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterable
from typing import Final

DEFAULT_MAX_KEYS: Final = 4096


class OnChange:
    """The last reported state per key (see the module docstring)."""

    def __init__(self, *, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self._max_keys = max_keys
        self._states: collections.OrderedDict[Hashable, Hashable] = collections.OrderedDict()

    def changed(self, key: Hashable, state: Hashable) -> bool:
        """Whether `state` is new for `key` (then it is recorded as the last one)."""
        if key in self._states and self._states[key] == state:
            return False
        self._states[key] = state
        self._states.move_to_end(key)
        while len(self._states) > self._max_keys:
            self._states.popitem(last=False)
        return True

    def forget(self, key: Hashable) -> None:
        self._states.pop(key, None)

    def retain(self, keys: Iterable[Hashable]) -> None:
        kept = set(keys)
        for key in [k for k in self._states if k not in kept]:
            del self._states[key]

    def __len__(self) -> int:
        return len(self._states)
