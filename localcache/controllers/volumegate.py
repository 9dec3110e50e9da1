"""`disableVolumeManagement` of the live configuration, read at reconcile time.

The ConfigMap informer syncs only once the Manager runs, so the cache controllers cannot read
the setting when they are set up. `Gated` sends each reconcile to the reconciler that matches
the configuration in force: with InferenceServices while volume management is on, without
them (no serving volumes, no `status.inferenceServices`, as when InferenceServices are not
watched) while it is off. `VolumeManagement.flipped()` lets the composition root reconcile
every cache again when that setting or `volumeSource` changes (switching to `csi` replaces the
pairs that show a whole models root: `legacy`).
"""

from __future__ import annotations

from dataclasses import dataclass

from localcache.controllers import state
from localcache.runtime import keys, reconcile


@dataclass
class VolumeManagement:
    """Whether the live configuration manages serving volumes (`disableVolumeManagement`
    off); `flipped()` says whether that, or the `volumeSource` of new volumes, changed since it
    was last asked."""

    source: state.ConfigSource
    last: tuple[bool, str] | None = None

    def on(self) -> bool:
        return not self.source().local_model.disable_volume_management

    def flipped(self) -> bool:
        now, before = (self.on(), self.source().local_model.volume_source), self.last
        self.last = now
        return before is not None and now != before


class Gated:
    """A cache reconciler following the live `disableVolumeManagement`: each reconcile goes
    to `managed` (InferenceServices read) while volume management is on, else to `unmanaged`
    (built over stores without InferenceServices, as when they are not watched)."""

    def __init__(
        self,
        mode: VolumeManagement,
        managed: reconcile.Reconciler,
        unmanaged: reconcile.Reconciler,
    ) -> None:
        self._mode = mode
        self._managed = managed
        self._unmanaged = unmanaged

    async def reconcile(self, key: keys.ObjectKey) -> reconcile.Result:
        chosen = self._managed if self._mode.on() else self._unmanaged
        return await chosen.reconcile(key)
