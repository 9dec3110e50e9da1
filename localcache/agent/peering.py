"""The agent's side of peer distribution at launch time: which mode a unit's next Job runs
in, the fast fallback to the origin, and the peer numbers in status.

`Peering` is consulted by the reconciler only; with the unit's node group's
`spec.peerDistribution.enabled` off, none of its methods makes a request or changes anything
(the Jobs and status are those of an agent without peer distribution; a peer-mode Job left
from before is still stopped if it never starts):
- `mode(unit, ...)` when a unit must launch: after a failed peer-mode Job, or one stopped
  for never starting (`agent.peerstart`) -> the origin (a `localcache_p2p_fallbacks_total
  {reason}` count and a `PeerFallback` Event on the LocalModelNode); peer mode unavailable
  (no `--peer-image`, no readable CA certificate, the LIST refused; logged once each) -> the
  origin; else `peerplan.plan` over the group's LocalModelNodes (one LIST, kept
  `LIST_TTL_S`, no watch; an origin decision on a kept LIST is taken again on a fresh one:
  two nodes that each saw no seed in an older LIST would both use the origin) -> a peer-mode
  Job (`Mode.transform`, `agent.jobs.peerjob`), the origin, or a `DownloadPending` outcome
  while a seed downloads (rechecked every `SEED_RECHECK_S`, timed by `agent.peerwait`;
  `peerplan.SEED_FALLBACKS` end it);
- `fast_fallback(action, latest, now)`: a failed peer-mode Job whose pod exited "use origin"
  (`peer.EXIT_USE_ORIGIN`, or a `FetchReport` with outcome `use-origin`) is retried at once
  in origin mode, not after the backoff; one whose pod never starts is stopped (`peerstart`);
- `completed(job, outcome, ...)`: a promoted peer-mode Job's `peerBytes`/`originBytes` from
  its pod's report (bounded by what is on disk; origin bytes there mean the pod finished a
  file the peers broke off from the origin: a `resumed-at-origin` fallback); an origin Job in
  an enabled group: `source: origin`, `originBytes` = bytes on disk; origin bytes counted in
  `localcache_p2p_origin_bytes_total` (never per-source series: a report's names are a
  tenant's);
- `carry(outcome, previous)`: a progress about a Job keeps the `source`/`originBytes`/
  `peerBytes` an earlier outcome of that Job had (remembered per Job name, bounded) or the
  status before had for that Job.

The pods' reports, and the sources they name as serving bad bytes: `agent.peerreports`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pydantic
import structlog

from localcache.agent import downloads, peerplan, peerreports, peerstart, plan, report, status
from localcache.agent.jobs import launcher, peerjob
from localcache.agent.peerwait import SeedWaits
from localcache.api import modelnode, nodegroup
from localcache.caching import credentials
from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, metrics

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
Transform = Callable[[Obj, credentials.Injection], Obj]
DEFAULT_CA_PATH: Final = Path("/var/run/localcache/peer-tls/ca.crt")
DEFAULT_SEED_WAIT_S: Final = 300.0
LIST_TTL_S: Final = 2.0
FRESH_LIST_S: Final = 0.5
SEED_RECHECK_S: Final = 2.0
MAX_CA_BYTES: Final = 64 * 1024
MAX_MEMBERS: Final = 5000
_KEPT: Final = 256
_PROGRESS_FIELDS: Final = ("source", "origin_bytes", "peer_bytes")
RESUMED_AT_ORIGIN: Final = "resumed-at-origin"


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """`image`: the agent's `--peer-image` ("" = peer distribution unavailable); `ca_path`:
    the peer CA certificate (PEM) the fetchers verify servers against; `seed_wait_s`: how
    long a unit waits for a seed whose entry does not move before it uses the origin."""

    image: str = ""
    ca_path: Path = DEFAULT_CA_PATH
    seed_wait_s: float = DEFAULT_SEED_WAIT_S


@dataclass(frozen=True, slots=True)
class Mode:
    """How to launch: `source` for `ModelProgress.source` (None: peer distribution off),
    `transform` turns the origin Job into the peer-mode Job, or into a seed's origin Job that
    records the origin's checksums (None: the origin Job)."""

    source: str | None = None
    transform: Transform | None = None


def enabled(group: nodegroup.LocalModelNodeGroup | None) -> bool:
    """Whether the node group enables peer distribution."""
    spec = group.spec.peer_distribution if group is not None else None
    return spec is not None and spec.enabled


class Peering:
    """Peer distribution for the agent of `node_name` (see the module docstring)."""

    def __init__(
        self,
        *,
        node_name: str,
        api: launcher.Api,
        settings: PeerSettings,
        clock: clock_mod.Clock,
        reporter: report.Reporter,
        p2p: metrics.PeerMetrics | None,
    ) -> None:
        self._node = node_name
        self._api = api
        self._settings = settings
        self._clock = clock
        self._report = reporter
        self._p2p = p2p
        self._listed: tuple[float, list[modelnode.LocalModelNode]] | None = None
        self._waits = SeedWaits()
        self._said = peerreports.Reports(api, reporter, p2p)
        self._warned: set[str] = set()
        self._fell: dict[str, None] = {}  # uids of peer Jobs whose fallback is counted
        self._known: dict[str, dict[str, Any]] = {}  # per Job name: its peer progress fields
        self._starts = peerstart.StartWatch()

    async def mode(
        self,
        unit: downloads.Unit,
        *,
        node: modelnode.LocalModelNode,
        group: nodegroup.LocalModelNodeGroup,
        previous: downloads.JobRef | None,
        max_size: int,
    ) -> Mode | status.Outcome:
        """The mode of the unit's next Job, or the outcome while it waits for a seed."""
        spec = group.spec.peer_distribution
        if spec is None or not spec.enabled:
            return Mode()
        origin = Mode(peerplan.SOURCE_ORIGIN, self._seed(unit, group))
        wait_key = (unit.storage_key, unit.scope_id, group.name)
        not_started = self._starts.take(unit.storage_key, unit.scope_id)
        failed_peer = previous is not None and peerjob.is_peer(previous.obj)
        if not_started or failed_peer:
            self._waits.done(wait_key)  # the origin's turn, not a wait
        if previous is not None and failed_peer:
            if self._first_fallback_of(previous):  # a launch may be retried
                said = await self.pod_report(previous)
                await self._said.bad_sources(node, previous, said)
                reason = "use-origin" if said.use_origin else "peer-failed"
                await self._fell_back(node, unit, reason, f"peer-mode Job {previous.name} failed")
            return origin
        if not_started:  # a peer-mode Job, or a seed's sidecar: the plain origin Job now
            why = f"a peer-mode or seed Job did not start within {int(peerstart.START_S)} s"
            await self._fell_back(node, unit, "peer-not-started", why)
            return Mode(peerplan.SOURCE_ORIGIN)
        ca = await self._ca()
        if ca is None:
            return origin
        now = self._clock.now()
        self._waits.prune(now, 2 * self._settings.seed_wait_s + 60)
        waited_s, seed_clock = self._waits.request_fields(wait_key, now)
        for fresh in (False, True):  # the origin costs origin bytes: decided on a fresh LIST
            try:
                members, cached = await self._members(group.name, fresh=fresh)
            except errors.ApiError as exc:  # e.g. RBAC: the origin still works
                self._warn_once("peer_nodes_not_listed", str(exc))
                return origin
            decision = peerplan.plan(
                peerplan.Request(
                    storage_key=unit.storage_key,
                    scope=unit.scope_id,
                    node_name=self._node,
                    status_key=unit.status_keys[0],
                    spec=spec,
                    members=members,
                    waited_s=waited_s,
                    seed_clock=seed_clock,
                    seed_wait_s=self._settings.seed_wait_s,
                    provable=bool(spec.proof_origins)
                    and unit.leader.source_model_uri.startswith("s3://"),
                )
            )
            if not (cached and isinstance(decision, peerplan.Origin)) or fresh:
                break
        if isinstance(decision, peerplan.WaitForSeed):
            started = self._waits.waiting(wait_key, decision, now)
            progress = modelnode.ModelProgress(message=decision.message)
            again = SEED_RECHECK_S
            if decision.node == self._node:  # settling (`peerplan.SETTLE_S`), not a seed wait
                again = max(0.05, peerplan.SETTLE_S - (now - started))
            return status.Outcome(modelnode.ModelStatus.DOWNLOAD_PENDING, progress, again)
        self._waits.done(wait_key)
        if isinstance(decision, peerplan.Origin):
            seed_why = peerplan.SEED_FALLBACKS.get(decision.reason)
            if seed_why is not None:
                await self._fell_back(node, unit, decision.reason, seed_why)
            return origin
        transform = functools.partial(
            peerjob.peer_job,
            image=self._settings.image,
            storage_key=unit.storage_key,
            digest=decision.digest,
            sources=decision.sources,
            ca_pem=ca,
            max_size=max_size,
            prove_uri=unit.leader.source_model_uri if decision.prove else None,
        )
        log.info("peer_download_planned", storage_key=unit.storage_key, sources=decision.sources)
        return Mode(decision.source, transform)

    def _seed(self, unit: downloads.Unit, group: nodegroup.LocalModelNodeGroup) -> Transform | None:
        """The origin Job's transform where it seeds an `s3://` model: it records the
        origin's checksums first (`peerjob.seed_job` with the peer image)."""
        uri, image = unit.request.uri, self._settings.image
        if not image or not uri.startswith("s3://"):
            return None
        return lambda job, _: peerjob.seed_job(job, group, uri, image=image)

    async def refused(self, node: modelnode.LocalModelNode, unit: downloads.Unit, why: str) -> Mode:
        """A peer-mode Job (or a seed's, `_seed`) the API refused (an admission policy, a
        quota): the plain origin Job at once, counted and said as a fallback."""
        await self._fell_back(node, unit, "peer-job-refused", why)
        return Mode(peerplan.SOURCE_ORIGIN)

    async def fast_fallback(
        self, action: plan.Action, latest: downloads.JobRef | None, now: datetime.datetime
    ) -> plan.Action:
        """A failed peer-mode Job that said "use origin": its retry now, not after the
        backoff; the unit's `latest` Job, peer-mode and never started: stopped
        (`peerstart`); any other action as it is."""
        if not isinstance(action, plan.Wait) or action.failed is None:
            return self._starts.check(action, latest, now)
        failed = action.failed
        if not peerjob.is_peer(failed.obj) or not (await self.pod_report(failed)).use_origin:
            return action
        message = action.outcome.progress.message
        return plan.Launch(attempt=failed.attempt + 1, message=message, retry_of=failed)

    async def completed(
        self,
        job: downloads.JobRef,
        outcome: status.Outcome,
        *,
        group: nodegroup.LocalModelNodeGroup | None,
        node: modelnode.LocalModelNode,
    ) -> status.Outcome:
        """The promoted Job's outcome with the peer numbers (unchanged when off)."""
        on_disk = outcome.progress.bytes_on_disk or 0
        if peerjob.is_peer(job.obj):
            pod = await self.pod_report(job)
            await self._said.bad_sources(node, job, pod)
            said = pod.report
            if said is None:  # the pod is gone (TTL) or wrote no report
                return outcome
            update: dict[str, Any] = {
                "peer_bytes": min(said.peer_bytes, on_disk),
                "origin_bytes": min(said.origin_bytes, on_disk),
            }
            if update["origin_bytes"]:  # the peers broke a file off: finished by Range
                await self._resumed_at_origin(node, job, update["origin_bytes"])
        elif enabled(group):
            update = {"source": peerplan.SOURCE_ORIGIN, "origin_bytes": on_disk}
        else:
            return outcome
        if self._p2p is not None and update["origin_bytes"]:
            self._p2p.origin_bytes.inc(update["origin_bytes"])
        progress = outcome.progress.model_copy(update=update)
        return dataclasses.replace(outcome, progress=progress)

    def carry(
        self, outcome: status.Outcome, previous: modelnode.ModelProgress | None
    ) -> status.Outcome:
        """`outcome` with the peer fields known for its Job: those an earlier outcome of this
        process gave it (remembered here), else those of the status before (`previous`,
        when about the same Job); an informer a write behind never loses them."""
        progress, job = outcome.progress, outcome.progress.job_name
        if not job:
            return outcome
        own = {
            f: getattr(progress, f) for f in _PROGRESS_FIELDS if getattr(progress, f) is not None
        }
        known = self._known.setdefault(job, {})
        known.update(own)
        if previous is not None and previous.job_name == job:
            for name in _PROGRESS_FIELDS:
                if getattr(previous, name) is not None:
                    known.setdefault(name, getattr(previous, name))
        while len(self._known) > _KEPT:
            self._known.pop(next(iter(self._known)))
        if not known:
            del self._known[job]
            return outcome
        update = {name: value for name, value in known.items() if name not in own}
        if not update:
            return outcome
        return dataclasses.replace(outcome, progress=progress.model_copy(update=update))

    async def pod_report(self, ref: downloads.JobRef) -> peerreports.PodReport:
        """What the Job's newest finished pod said (`peerreports.Reports.of`)."""
        return await self._said.of(ref)

    def _first_fallback_of(self, job: downloads.JobRef) -> bool:
        """True the first time only, per Job uid (the last `_KEPT` remembered)."""
        if job.uid in self._fell:
            return False
        self._fell[job.uid] = None
        if len(self._fell) > _KEPT:
            del self._fell[next(iter(self._fell))]
        return True

    async def _resumed_at_origin(
        self, node: modelnode.LocalModelNode, job: downloads.JobRef, size: int
    ) -> None:
        if not self._first_fallback_of(job):  # a Job may be looked at again
            return
        message = (
            f"model {job.status_key}: the peers broke off a file; Job {job.name} finished "
            f"it from the origin by Range ({size} bytes, {RESUMED_AT_ORIGIN})"
        )
        await self._say_fallback(node, RESUMED_AT_ORIGIN, message, spam_key=job.name)

    async def _fell_back(
        self, node: modelnode.LocalModelNode, unit: downloads.Unit, reason: str, why: str
    ) -> None:
        log.info("peer_fallback_to_origin", storage_key=unit.storage_key, reason=reason)
        key = unit.status_keys[0]
        message = f"model {key}: {why}; downloading from the origin ({reason})"
        await self._say_fallback(node, reason, message, spam_key=key)

    async def _say_fallback(
        self, node: modelnode.LocalModelNode, reason: str, message: str, *, spam_key: str
    ) -> None:
        """Count a fallback by `reason` and say it in a `PeerFallback` Event on `node`."""
        if self._p2p is not None:
            self._p2p.fallbacks.inc(reason=reason)
        await self._report.event(node, "Warning", "PeerFallback", message, spam_key=spam_key)

    async def _members(
        self, group: str, *, fresh: bool = False
    ) -> tuple[list[modelnode.LocalModelNode], bool]:
        """The LocalModelNodes with an entry of `group` (a LIST per `LIST_TTL_S`, `fresh`: per
        `FRESH_LIST_S`, so a pass launching many units lists once); from the kept LIST?"""
        now = self._clock.now()
        age = now - self._listed[0] if self._listed is not None else None
        cached = age is not None and age <= (FRESH_LIST_S if fresh else LIST_TTL_S)
        if not cached:
            listed = await self._api.list(report.LMN_RESOURCE)
            nodes = []
            for obj in listed.items[:MAX_MEMBERS]:
                try:
                    nodes.append(modelnode.LocalModelNode.model_validate(obj))
                except pydantic.ValidationError:
                    continue
            self._listed = (now, nodes)
        assert self._listed is not None
        members = [
            n for n in self._listed[1] if any(e.node_group == group for e in n.spec.local_models)
        ]
        return members, cached

    async def _ca(self) -> str | None:
        """The peer CA certificate, or None (peer mode unavailable; logged once each)."""
        if not self._settings.image:
            self._warn_once("peer_image_unset", "no --peer-image: downloads use the origin")
            return None
        try:
            pem = await asyncio.to_thread(_read_bounded, self._settings.ca_path, MAX_CA_BYTES)
        except OSError as exc:
            self._warn_once("peer_ca_unreadable", f"{self._settings.ca_path}: {exc.strerror}")
            return None
        if "BEGIN CERTIFICATE" not in pem:
            self._warn_once("peer_ca_unreadable", f"{self._settings.ca_path}: no certificate")
            return None
        self._warned.discard("peer_ca_unreadable")
        return pem

    def _warn_once(self, event: str, why: str) -> None:
        if event not in self._warned:
            self._warned.add(event)
            log.warning(event, detail=why)


def _read_bounded(path: Path, limit: int) -> str:
    with path.open("rb") as handle:
        return handle.read(limit).decode("ascii", errors="replace")
