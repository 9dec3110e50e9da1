"""Adopting model folders that KServe's localmodel add-on downloaded, so that migrating to
localcache downloads nothing again.

KServe's agent keeps a model at `<root>/models/<storage key>`, as this agent does, but writes
no manifest: it takes a folder as downloaded when its Job succeeded, and reports
`ModelDownloaded` in `status.modelStatus[<status key>]`. This agent takes a folder without a
manifest for a partial one; adoption is the exception, on evidence only that agent can give.

Contract:
- Evidence is read once per process, from the LocalModelNode as the agent first reads it
  (`Adoptions.observe`): each status key whose `modelStatus` says `ModelDownloaded`, with the
  storage key of its spec entry then. Only the node's agent writes that status (tenants cannot:
  README "Security model"); a status read later is no evidence (it may be this agent's own).
- A unit whose folder has no complete manifest is adopted (`plan.decide` answers `Adopt`
  from `Adoptions.claims`, the reconciler calls `Adoptions.adopt`) when ALL hold: evidence
  names one of its status keys with its storage key; no Job of this agent for that storage
  key is live in the pass; and `ModelDisk.adopt` accepts the folder on the root
  serving the unit (a real, non-empty directory, no manifest, no promotion record, its tree
  fully checked and cleaned as a promotion's is; modes of another uid's files are tolerated).
- Evidence for a status key is used at most once: dropped (`Adoptions.settle`) when its
  unit is considered on a root (adopted or not) and when the key leaves the spec or changes
  storage key. A unit that cannot be placed on a root keeps it, in this process only.
- Adopted: the manifest is marked `adopted` and records the unit's tag (`layout.Manifest`),
  one log line `model_folder_adopted` and one Normal Event `ModelFolderAdopted` are emitted,
  and the caller reports the unit `ModelDownloaded` with no Job. Otherwise nothing changes
  (a `model_folder_not_adopted` line says why, when there was evidence) and the caller goes
  on as for any incomplete folder.
- No status is written here. The reconciler considers every unit before its one status write
  of the pass, so no write of ours replaces KServe's `ModelDownloaded` before the decision.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Collection, Mapping
from typing import Any

import structlog

from localcache.agent import downloads, plan, report, status
from localcache.agent.disk import folders, layout
from localcache.api import modelnode
from localcache.caching import keys

log = structlog.get_logger(__name__)

ADOPTED_REASON = "ModelFolderAdopted"


def evidence(
    node: modelnode.LocalModelNode, current_status: Mapping[str, Any] | None
) -> dict[str, str]:
    """Status key -> storage key of each spec entry that `current_status` reports
    `ModelDownloaded`."""
    states = status.previous_states(current_status)
    downloaded = modelnode.ModelStatus.DOWNLOADED.value
    return {
        key: keys.storage_key(entry.source_model_uri)
        for entry in node.spec.local_models
        if states.get(key := downloads.status_key(entry)) == downloaded
    }


def job_live(storage_key: str, live_jobs: Collection[str]) -> bool:
    """Whether one of the named Jobs (this agent's live download Jobs) downloads `storage_key`."""
    return any(
        (p := downloads.parse_job_name(n)) is not None and p[0] == storage_key for n in live_jobs
    )


class Adoptions:
    """The evidence of one agent process and the adoptions it allows (module contract)."""

    def __init__(self, *, node_name: str, reporter: report.Reporter) -> None:
        self._node_name = node_name
        self._report = reporter
        self._evidence: dict[str, str] | None = None

    def observe(
        self, node: modelnode.LocalModelNode, current_status: Mapping[str, Any] | None
    ) -> None:
        """Take the evidence from the first read; later reads only drop what left the spec."""
        if self._evidence is None:
            self._evidence = evidence(node, current_status)
            if self._evidence:
                log.info(
                    "adoption_evidence", node=self._node_name, status_keys=sorted(self._evidence)
                )
            return
        spec = {
            downloads.status_key(e): keys.storage_key(e.source_model_uri)
            for e in node.spec.local_models
        }
        self._evidence = {k: v for k, v in self._evidence.items() if spec.get(k) == v}

    def claims(self, unit: downloads.Unit) -> list[str]:
        """The unit's status keys that the evidence reports downloaded into its folder."""
        held = self._evidence or {}
        return [k for k in unit.status_keys if held.get(k) == unit.storage_key]

    def settle(self, unit: downloads.Unit) -> None:
        """Drop the unit's evidence: it was considered on a root (adopted or not)."""
        for key in unit.status_keys:
            (self._evidence or {}).pop(key, None)

    async def adopt(
        self,
        unit: downloads.Unit,
        claimed: list[str],
        *,
        at: folders.ModelDisk,
        live_jobs: Collection[str],
        node: modelnode.LocalModelNode,
        now: datetime.datetime,
    ) -> layout.Manifest | None:
        """Adopt the unit's folder on `at` for the `claimed` status keys when the contract
        allows; the manifest written, or None (nothing changed). The caller then `settle`s
        the unit, unless this raised."""
        key = unit.storage_key
        if job_live(key, live_jobs):
            done = layout.Adoption(refused="a download Job of this agent is live for it")
        else:
            done = await asyncio.to_thread(
                at.adopt,
                key,
                uri=unit.request.uri,
                job=unit.tag,
                completed_at=plan.format_time(now),
            )
        if done.manifest is None:
            log.info(
                "model_folder_not_adopted",
                node=self._node_name,
                storage_key=key,
                status_keys=claimed,
                reason=done.refused,
            )
            return None
        size = done.manifest.bytes
        log.info(
            "model_folder_adopted",
            node=self._node_name,
            storage_key=key,
            status_keys=claimed,
            bytes=size,
            modes_not_fixed=len(done.modes_not_fixed),
        )
        message = (
            f"model folder {layout.model_subpath(key)} on {at.host_path or at.root}, which "
            f"KServe's localmodel agent reported downloaded for {', '.join(claimed)}, adopted "
            f"without a download ({size} bytes)"
        )
        if done.modes_not_fixed:
            message += (
                f"; the modes of {len(done.modes_not_fixed)} entries of another uid could not be "
                "normalised"
            )
        await self._report.event(node, "Normal", ADOPTED_REASON, message)
        return done.manifest
