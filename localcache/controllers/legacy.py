"""Volumes that show a whole models root, replaced by localcache's CSI volumes without
downloading anything again: PVs adopted from KServe's add-on (its node group's `hostPath` or
`local` source) and PVs made by localcache before CSI volumes (README "After the hand-over").

A pair is *legacy* when its PV is the cache's and the PV the cache wants has a `csi` source
(`localModel.volumeSource: csi`) while the one in place has none. Only the two objects change:
the model folder stays where it is on every node (a PV's source is immutable, so the pair is
deleted and made anew, claim first, by `volumes`).

Deleting a claim that a pod still mounts would hold it Terminating (pvc-protection), and every
new pod of that claim would wait until the old ones end, which a rolling update never does on
its own. So a legacy pair is replaced only when no pod of the claim's namespace that has not
terminated mounts it, as pvc-protection counts them. `ClaimUsers` lists that namespace's pods
in pages (at most `MAX_PODS_SCANNED`; a namespace with more counts as in use: a tenant must
not make the controller hold an unbounded list), at most once per `RECHECK` seconds per claim,
and remembers the answer; while a pod holds the claim the cache is looked at again after
`RECHECK` seconds (log `volume_legacy_in_use`, naming the pod). A pod created between the list
and the delete only delays the replacement: the claim stays Terminating until that pod ends.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from localcache.controllers import adoption, state, volumewriter
from localcache.runtime import errors, kube
from localcache.runtime import keys as runtime_keys

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
RECHECK: Final = 30.0
"""Seconds between two looks at the pods of one legacy claim."""
PAGE: Final = 100
MAX_PODS_SCANNED: Final = 5000
MAX_REMEMBERED: Final = 4096
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


def is_legacy(found_pv: Obj, wanted_pv: Obj) -> bool:
    """Whether the PV in place shows a models root where a CSI volume is wanted."""
    wanted = (wanted_pv.get("spec") or {}).get("csi")
    return bool(wanted) and not (found_pv.get("spec") or {}).get("csi")


def _mounts(pod: Obj, claim: str) -> bool:
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName") == claim:
            return True
    return False


@dataclass(slots=True)
class ClaimUsers:
    """Who mounts legacy claims, looked up at most once per `RECHECK` seconds per claim
    (module docstring). `holder` answers "" when no pod mounts the claim."""

    clock: Callable[[], float] = time.monotonic
    _seen: OrderedDict[runtime_keys.ObjectKey, tuple[float, str]] = field(
        default_factory=OrderedDict
    )

    async def holder(self, api: state.Api, claim: runtime_keys.ObjectKey) -> str:
        now = self.clock()
        remembered = self._seen.get(claim)
        if remembered is not None and now - remembered[0] < RECHECK:
            return remembered[1]
        try:
            found = await self._scan(api, claim)
        except errors.ApiError as exc:  # e.g. 403 from an install without `pods list`
            _log.warning("volume_legacy_pods_unreadable", claim=str(claim), error=str(exc))
            found = f"(pods of {claim.namespace} unreadable: {exc.status} {exc.reason})"
        self._seen[claim] = (now, found)
        self._seen.move_to_end(claim)
        while len(self._seen) > MAX_REMEMBERED:
            self._seen.popitem(last=False)
        return found

    def forget(self, claim: runtime_keys.ObjectKey) -> None:
        self._seen.pop(claim, None)

    async def _scan(self, api: state.Api, claim: runtime_keys.ObjectKey) -> str:
        token: str | None = None
        scanned = 0
        while True:
            page = await api.list(
                kube.PODS, namespace=claim.namespace, limit=PAGE, continue_token=token
            )
            for pod in page.items:
                phase = str((pod.get("status") or {}).get("phase") or "")
                if phase not in TERMINAL_PHASES and _mounts(pod, claim.name):
                    return str((pod.get("metadata") or {}).get("name") or "?")
            scanned += len(page.items)
            if not page.continue_token:
                return ""
            if scanned >= MAX_PODS_SCANNED:
                return f"(more than {MAX_PODS_SCANNED} pods in {claim.namespace}: not scanned)"
            token = page.continue_token


async def replace_when_unused(
    writer: volumewriter.Writer,
    users: ClaimUsers,
    *,
    pv: Obj,
    pvc: Obj,
    claim: runtime_keys.ObjectKey,
) -> bool:
    """Delete the legacy pair when no pod mounts its claim: the PV's reclaim policy is set to
    Retain first (a separate write; its update event brings the cache back), so that no
    volume plugin acts on the folder. True when the pair waits for a pod."""
    holder = await users.holder(writer.api, claim)
    name = str((pv.get("metadata") or {}).get("name") or "")
    if holder:
        _log.info("volume_legacy_in_use", pv=name, claim=str(claim), pod=holder)
        return True
    retain = adoption.retain_patch(pv)
    if retain is not None:
        await writer.patch(kube.PERSISTENT_VOLUMES, pv, retain)
        return False
    _log.info("volume_legacy_replaced", pv=name, claim=str(claim))
    users.forget(claim)
    await writer.delete(kube.PERSISTENT_VOLUME_CLAIMS, pvc)
    await writer.delete(kube.PERSISTENT_VOLUMES, pv)
    return False
