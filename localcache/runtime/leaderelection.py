"""Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics.

`LeaderElector.run()` campaigns until it holds the lease, renews it every `retry_period`
while it leads, and campaigns again whenever it loses it, until cancelled. Defaults are
client-go's: lease 15 s, renew deadline 10 s, retry 2 s.

- Acquire: GET the Lease (create it if missing). Another holder's lease counts as valid
  until `leaseDurationSeconds` have passed on *our* clock since we first saw its current
  record (so clock skew between machines does not matter). A free or expired lease is taken
  with a compare-and-swap PUT on its resourceVersion; a 409 means someone else won.
  Taking it over from another holder sets `acquireTime` and bumps `leaseTransitions`.
- Renew: while leading, PUT a fresh `renewTime` (straight from the cached object; GET first
  only if that fails). Every API call has a timeout of at most renew_deadline / 2 and a whole
  attempt never outlives the renew deadline.
- Lost: no successful renewal within `renew_deadline` of the start of the last successful
  attempt, or a renewal that finds another holder's valid record → `leading` clears and
  `not_leading` sets, the `leader_election_master_status` gauge goes to 0,
  `leader_election_lost` is logged, and the elector campaigns again (unlike client-go, the
  process is not meant to exit: the Manager stops only what needs the lease).
- Cancelled while leading (clean shutdown) → the lease is released (holder cleared,
  duration 1 s) so a successor takes over at once, unless `release_on_cancel=False`.

Timing contract (what lets the Manager promise that two replicas never run leader-only work
at once). A renewal is counted from the moment its request was *sent*, which is before the
apiserver stored it; any other replica sees that record at the earliest when it is stored
and waits `lease_duration` after first seeing it before taking the lease. So on clocks that
run at the same rate, another replica can hold the lease no earlier than
`lease_duration` after our last renewal, while we declare the lease lost at the latest
`renew_deadline` after it. `stop_margin` = lease_duration - renew_deadline is therefore the
time the holder has, after `not_leading` is set, to stop every leader-only task (the Manager
bounds that stop by it and fails the process if a task does not stop in time).

Not promised: fencing. Between the moment a leader's renewals start failing and
`renew_deadline`, it still believes it leads; a reconcile that already sent a request cannot
take it back; clocks that run at different rates (not merely offset) void the margin.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import random
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, kube

_log = structlog.get_logger(__name__)

JITTER_FACTOR = 1.2
"""client-go's acquire-loop jitter: each wait is retry_period * [1, 2.2)."""

Obj = dict[str, Any]


class MasterStatus(Protocol):
    """Where the elector reports `leader_election_master_status` (metrics.leader_election)."""

    def set_master_status(self, leading: bool) -> None: ...


def default_identity() -> str:
    """hostname + "_" + a random UUID, as controller-runtime does."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


@dataclass(frozen=True, slots=True)
class LeaderElectionConfig:
    namespace: str
    name: str
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if not self.renew_deadline > JITTER_FACTOR * self.retry_period:
            raise ValueError("renew_deadline must be greater than 1.2 * retry_period")
        if self.retry_period <= 0 or not self.identity:
            raise ValueError("retry_period must be positive and identity non-empty")

    @property
    def request_timeout(self) -> float:
        """The timeout of each lease API call: max(renew_deadline / 2, 1 s)."""
        return max(self.renew_deadline / 2, 1.0)

    @property
    def stop_margin(self) -> float:
        """Seconds a replica has, once it knows it lost the lease, to stop leader-only work
        before another replica can hold the lease (module doc, "Timing contract")."""
        return self.lease_duration - self.renew_deadline


def _now_micro() -> str:
    return clock_mod.rfc3339_micro(datetime.datetime.now(datetime.UTC))


class LeaderElector:
    """Campaigns for and holds one Lease (see the module docstring)."""

    def __init__(
        self,
        client: kube.Kube,
        config: LeaderElectionConfig,
        *,
        clock: clock_mod.Clock | None = None,
        metrics: MasterStatus | None = None,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._kube = client
        self.config = config
        self._clock = clock or clock_mod.SystemClock()
        self._metrics = metrics
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._rng = rng or random.Random()
        self._observed: Obj | None = None  # the last Lease object seen (or written)
        self._observed_at = 0.0  # clock time its spec was first seen
        self.holder = ""
        """The holder identity last observed ("" when unknown or free)."""
        self.leading = asyncio.Event()
        """Set while this process holds the lease."""
        self.not_leading = asyncio.Event()
        """Set while this process does not hold the lease (the complement of `leading`)."""
        self.not_leading.set()
        self.terms = 0
        """How many times this process has acquired the lease."""
        if metrics is not None:
            metrics.set_master_status(False)

    @property
    def identity(self) -> str:
        return self.config.identity

    @property
    def is_leader(self) -> bool:
        return self.leading.is_set()

    async def run(self) -> None:
        """Campaign, lead until the lease is lost, campaign again; until cancelled (then
        the lease is released if held)."""
        cfg = self.config
        log = _log.bind(lease=f"{cfg.namespace}/{cfg.name}", identity=cfg.identity)
        try:
            while True:
                log.info("leader_election_campaigning")
                last_renewal = await self._acquire()
                self._became_leader()
                log.info("leader_election_acquired", term=self.terms)
                await self._renew_until_lost(last_renewal)
                self._stopped_leading()
                log.error(
                    "leader_election_lost",
                    term=self.terms,
                    holder=self.holder,
                    renew_deadline=cfg.renew_deadline,
                    stop_margin=cfg.stop_margin,
                )
        except asyncio.CancelledError:
            if self.is_leader:
                if cfg.release_on_cancel:
                    await self._release()
                self._stopped_leading()
            raise

    async def _acquire(self) -> float:
        """Try until the lease is ours; return when the successful attempt started."""
        cfg = self.config
        while True:
            started = self._clock.now()
            if await self._attempt(deadline=None):
                return started
            await self._clock.sleep(cfg.retry_period * (1 + self._rng.random() * JITTER_FACTOR))

    async def _renew_until_lost(self, last_renewal: float) -> None:
        """Renew every retry period; return once the lease counts as lost: the renew
        deadline passed since the start of the last successful attempt, or a valid record
        of another holder was seen."""
        cfg = self.config
        while True:
            deadline = last_renewal + cfg.renew_deadline
            await self._clock.sleep(min(cfg.retry_period, max(0.0, deadline - self._clock.now())))
            started = self._clock.now()
            if await self._attempt(deadline=deadline):
                last_renewal = started
            elif self.holder not in ("", self.identity) or self._clock.now() >= deadline:
                return

    # ---------------------------------------------------------------- attempts

    async def _attempt(self, *, deadline: float | None) -> bool:
        """One try_acquire_or_renew, bounded by `deadline` (clock time) when renewing."""
        budget = self.config.renew_deadline
        if deadline is not None:
            budget = max(0.0, deadline - self._clock.now())
        try:
            async with asyncio.timeout(budget):
                return await self._try_acquire_or_renew()
        except TimeoutError:
            _log.warning("leader_election_attempt_timed_out", budget=round(budget, 3))
            return False

    def _record(self, lease: Obj | None, *, renewing: bool) -> Obj:
        now = _now_micro()
        old = (lease or {}).get("spec") or {}
        transitions = int(old.get("leaseTransitions") or 0)
        spec: Obj = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.config.lease_duration),
            "renewTime": now,
            "acquireTime": old.get("acquireTime") if renewing else now,
            "leaseTransitions": transitions if renewing or not lease else transitions + 1,
        }
        if not spec["acquireTime"]:
            spec["acquireTime"] = now
        if lease is None:
            return {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.config.name, "namespace": self.config.namespace},
                "spec": spec,
            }
        new = copy.deepcopy(lease)
        new["spec"] = spec
        return new

    async def _try_acquire_or_renew(self) -> bool:
        cfg = self.config
        timeout = cfg.request_timeout
        # Fast path: the last record we saw is ours and still valid → write the renewal
        # straight from the cached object (client-go: IsLeader() && isLeaseValid()).
        if self.holder == self.identity and self._observed is not None and self._lease_valid():
            try:
                updated = await self._kube.replace(
                    kube.LEASES,
                    self._record(self._observed, renewing=True),
                    request_timeout=timeout,
                )
            except errors.LocalcacheError as exc:
                _log.info("leader_election_renew_fast_path_failed", error=str(exc))
            else:
                self._observe(updated)
                return True
        try:
            lease = await self._kube.get(
                kube.LEASES, cfg.name, namespace=cfg.namespace, request_timeout=timeout
            )
        except errors.NotFound:
            try:
                created = await self._kube.create(
                    kube.LEASES, self._record(None, renewing=False), request_timeout=timeout
                )
            except errors.LocalcacheError as exc:
                _log.info("leader_election_create_failed", error=str(exc))
                return False
            self._observe(created)
            return True
        except errors.LocalcacheError as exc:
            _log.info("leader_election_get_failed", error=str(exc))
            return False
        self._observe(lease)
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        if holder and holder != self.identity and self._lease_valid():
            return False  # someone else holds a valid lease
        try:
            updated = await self._kube.replace(
                kube.LEASES,
                self._record(lease, renewing=holder == self.identity),
                request_timeout=timeout,
            )
        except errors.LocalcacheError as exc:
            _log.info("leader_election_update_failed", error=str(exc))
            return False
        self._observe(updated)
        return True

    def _observe(self, lease: Obj) -> None:
        spec = lease.get("spec") or {}
        previous = (self._observed or {}).get("spec")
        if previous != spec:
            self._observed_at = self._clock.now()
        self._observed = lease
        holder = str(spec.get("holderIdentity") or "")
        if holder != self.holder:
            self.holder = holder
            if holder:
                _log.info("leader_election_new_leader", leader=holder)
                if self._on_new_leader is not None:
                    self._on_new_leader(holder)

    def _lease_valid(self) -> bool:
        spec = (self._observed or {}).get("spec") or {}
        duration = float(spec.get("leaseDurationSeconds") or self.config.lease_duration)
        return self._observed_at + duration > self._clock.now()

    async def _release(self) -> None:
        """Clear the holder so a successor need not wait out the lease."""
        if self._observed is None:
            return
        released = copy.deepcopy(self._observed)
        now = _now_micro()
        spec = released.get("spec") or {}
        released["spec"] = {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "renewTime": now,
            "acquireTime": now,
            "leaseTransitions": int(spec.get("leaseTransitions") or 0),
        }
        try:
            async with asyncio.timeout(self.config.request_timeout):
                await self._kube.replace(
                    kube.LEASES, released, request_timeout=self.config.request_timeout
                )
        except (errors.LocalcacheError, TimeoutError) as exc:
            _log.warning("leader_election_release_failed", error=str(exc))
        else:
            _log.info("leader_election_released")

    # ---------------------------------------------------------------- state

    def _became_leader(self) -> None:
        self.terms += 1
        self.not_leading.clear()
        self.leading.set()
        if self._metrics is not None:
            self._metrics.set_master_status(True)
        if self._on_started is not None:
            self._on_started()

    def _stopped_leading(self) -> None:
        if not self.leading.is_set():
            return
        self.leading.clear()
        self.not_leading.set()
        if self._metrics is not None:
            self._metrics.set_master_status(False)
        if self._on_stopped is not None:
            self._on_stopped()
