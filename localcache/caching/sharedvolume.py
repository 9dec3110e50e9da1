"""Shared-volume namespace caches (`spec.pvcRef`, KServe #6107): the claim preflight and the
destination owner rule. Pure rules over plain objects, no I/O.

- `preflight(claim, model_size)` checks the claim a cache names, in KServe's order: Filesystem
  volume mode (absent means Filesystem), ReadWriteMany among the access modes, the requested
  storage (when given) at least `modelSize`, and, once the claim is Bound, its capacity at
  least `modelSize`. An unbound claim with a large enough request passes (provisioning and
  binding may follow the import Job's pod). The first failed check is answered as a
  `Verdict` whose message names the values; None when the claim is usable.
- `precedes(a, b)` is KServe's owner order of two caches of one destination (namespace,
  pvcRef, storage key): the earlier creationTimestamp wins, then the smaller name, then the
  smaller uid. `destination_owner(cache, others)` is the cache among `others` (the shared
  caches of the namespace, read by a fresh LIST) that holds the destination ahead of
  `cache`, or None when `cache` owns it. Caches being deleted still hold their destination
  until they are gone (their import Job may still write), as in KServe.

The reasons of the `Ready` condition of a shared-volume cache are here too (KServe's, plus
`ImportCredentialError`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from localcache.api import quantity
from localcache.caching import keys

Obj = dict[str, Any]

REASON_PVC_NOT_FOUND: Final = "PVCNotFound"
REASON_UNSUPPORTED_VOLUME_MODE: Final = "UnsupportedVolumeMode"
REASON_UNSUPPORTED_ACCESS_MODE: Final = "UnsupportedAccessMode"
REASON_INSUFFICIENT_CAPACITY: Final = "InsufficientCapacity"
REASON_DESTINATION_CONFLICT: Final = "DestinationConflict"
REASON_IMPORT_PENDING: Final = "ImportPending"
REASON_IMPORT_RUNNING: Final = "ImportRunning"
REASON_IMPORT_FAILED: Final = "ImportFailed"
REASON_IMPORT_JOB_CONFLICT: Final = "ImportJobConflict"
REASON_IMPORT_SUCCEEDED: Final = "ImportSucceeded"
REASON_IMPORT_CREDENTIAL_ERROR: Final = "ImportCredentialError"
REASONS: Final = frozenset(
    {
        REASON_PVC_NOT_FOUND,
        REASON_UNSUPPORTED_VOLUME_MODE,
        REASON_UNSUPPORTED_ACCESS_MODE,
        REASON_INSUFFICIENT_CAPACITY,
        REASON_DESTINATION_CONFLICT,
        REASON_IMPORT_PENDING,
        REASON_IMPORT_RUNNING,
        REASON_IMPORT_FAILED,
        REASON_IMPORT_JOB_CONFLICT,
        REASON_IMPORT_SUCCEEDED,
        REASON_IMPORT_CREDENTIAL_ERROR,
    }
)

READ_WRITE_MANY: Final = "ReadWriteMany"
BLOCK: Final = "Block"


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why a shared-volume cache is not Ready (reason and message of its condition)."""

    reason: str
    message: str


def _mapping(value: object) -> Obj:
    return value if isinstance(value, dict) else {}


def claim_not_found(name: str, namespace: str) -> Verdict:
    return Verdict(
        REASON_PVC_NOT_FOUND,
        f"PersistentVolumeClaim {name!r} not found in namespace {namespace!r}",
    )


def _storage(values: object) -> quantity.Quantity | None:
    raw = _mapping(values).get("storage")
    if raw is None:
        return None
    try:
        return quantity.Quantity(raw)
    except (quantity.QuantityError, TypeError, ValueError):
        return None


def preflight(claim: Obj, model_size: quantity.Quantity) -> Verdict | None:
    """Why `claim` cannot hold the model (module docstring), or None."""
    spec = _mapping(claim.get("spec"))
    name = str(_mapping(claim.get("metadata")).get("name") or "")
    mode = spec.get("volumeMode")
    if mode == BLOCK:
        return Verdict(
            REASON_UNSUPPORTED_VOLUME_MODE,
            f"PersistentVolumeClaim {name!r} has volumeMode {mode}; "
            "the referenced PVC must use Filesystem volume mode",
        )
    modes = [str(m) for m in spec.get("accessModes") or []]
    if READ_WRITE_MANY not in modes:
        return Verdict(
            REASON_UNSUPPORTED_ACCESS_MODE,
            f"PersistentVolumeClaim {name!r} has access modes [{', '.join(modes)}]; "
            "the referenced PVC must include the ReadWriteMany access mode",
        )
    requested = _storage(_mapping(spec.get("resources")).get("requests"))
    if requested is not None and requested < model_size:
        return Verdict(
            REASON_INSUFFICIENT_CAPACITY,
            f"PVC requested storage {requested} is smaller than model size {model_size}",
        )
    status = _mapping(claim.get("status"))
    if status.get("phase") == "Bound":
        capacity = _storage(status.get("capacity"))
        if capacity is not None and capacity < model_size:
            return Verdict(
                REASON_INSUFFICIENT_CAPACITY,
                f"PVC bound capacity {capacity} is smaller than model size {model_size}",
            )
    return None


# ------------------------------------------------------------------------ destination owner


@dataclass(frozen=True, slots=True)
class Claimant:
    """A shared-volume cache as the owner rule sees it."""

    name: str
    uid: str
    created: str
    """creationTimestamp (RFC 3339, second precision: string order is time order)."""
    pvc_ref: str
    storage_key: str

    @classmethod
    def of(cls, obj: Obj) -> Claimant | None:
        """From a cache object; None when it is not a shared-volume cache."""
        meta = _mapping(obj.get("metadata"))
        spec = _mapping(obj.get("spec"))
        ref, uri = spec.get("pvcRef"), spec.get("sourceModelUri")
        if not isinstance(ref, str) or not ref or not isinstance(uri, str):
            return None
        return cls(
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            created=str(meta.get("creationTimestamp") or ""),
            pvc_ref=ref,
            storage_key=keys.storage_key(uri),
        )

    def order(self) -> tuple[str, str, str]:
        return (self.created, self.name, self.uid)


def precedes(a: Claimant, b: Claimant) -> bool:
    """Whether `a` owns the destination ahead of `b` (creation time, then name, then uid)."""
    return a.order() < b.order()


def destination_owner(cache: Claimant, others: Iterable[Claimant]) -> Claimant | None:
    """The first (by the owner order) other cache of the same destination that precedes
    `cache`, or None when `cache` owns it."""
    rivals = [
        o
        for o in others
        if o.uid != cache.uid
        and o.pvc_ref == cache.pvc_ref
        and o.storage_key == cache.storage_key
        and precedes(o, cache)
    ]
    return min(rivals, key=Claimant.order) if rivals else None


def conflict(cache: Claimant, owner: Claimant, namespace: str) -> Verdict:
    return Verdict(
        REASON_DESTINATION_CONFLICT,
        f"destination pvc {cache.pvc_ref!r} already holds this model (models/"
        f"{cache.storage_key}) via cache {namespace}/{owner.name}",
    )


def served_uri(pvc_ref: str, storage_key: str) -> str:
    """Where routed workloads read the model: `pvc://<pvcRef>/models/<storage key>`."""
    return f"pvc://{pvc_ref}/models/{storage_key}"


def uses(uri: str | None, *, cache_uri: str, pvc_ref: str) -> bool:
    """Whether a workload's model (or adapter) URI is served by the shared cache: equal to or
    under the cache's source URI, or under its place on the claim (proof by URI)."""
    if not uri:
        return False
    return keys.match_storage_uri(cache_uri, uri) or keys.match_storage_uri(
        served_uri(pvc_ref, keys.storage_key(cache_uri)), uri
    )
