"""What the agent tells the world: the LocalModelNode's status, Events, and its metrics.

- `Reporter.write_status` patches the status subresource with the RFC 7386 diff of the owned
  fields (`status.py`), only when something changed, carrying the object's resourceVersion;
  on a conflict it re-reads the status and diffs again (a few times, then raises).
- `Reporter.record_jobs` patches only `downloadJobs`, the records of the Jobs the agent
  created (`agent.jobs.trust`), right after a create;
- `Reporter.untrusted_jobs` reports Jobs the agent does not trust (once per Job);
- `Reporter.event` posts a core/v1 Event about the LocalModelNode (in `default`, as for every
  cluster-scoped object) through `runtime.events.Recorder` (component `localcache-agent`,
  instance and host the node; deduplicated with a count bump); failing to post is logged,
  never raised.
- `AgentMetrics` are the agent's own series (downloads started, succeeded, failed, bytes,
  durations; peer downloads sent to the origin), made with the runtime's metric factories.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any, Final

import structlog

from localcache.agent import plan, stall, status
from localcache.agent.jobs import launcher
from localcache.api import groupversion, modelnode
from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, events, kube, metrics
from localcache.runtime import patch as patch_mod

log = structlog.get_logger(__name__)

LMN = groupversion.LOCAL_MODEL_NODE
LMN_RESOURCE: Final = kube.Resource(LMN.group, LMN.version, LMN.plural, LMN.kind, namespaced=False)
EVENT_SOURCE: Final = "localcache-agent"
EVENT_NAMESPACE: Final = "default"
STATUS_WRITE_ATTEMPTS: Final = 5


class AgentMetrics:
    """The agent's own series, made with the runtime's factories."""

    def __init__(self, registry: metrics.Metrics) -> None:
        self.started = registry.counter(
            "localcache_agent_downloads_started_total", "Download Jobs created by the agent"
        )
        self.succeeded = registry.counter(
            "localcache_agent_downloads_succeeded_total", "Downloads promoted into place"
        )
        self.failed = registry.counter(
            "localcache_agent_downloads_failed_total", "Download Jobs that failed for good"
        )
        self.bytes = registry.counter(
            "localcache_agent_downloaded_bytes_total", "Bytes of the downloads promoted"
        )
        self.duration = registry.histogram(
            "localcache_agent_download_duration_seconds",
            "Time from a download Job's start to its completion",
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400),
        )
        self.p2p = registry.peer()  # `localcache_p2p_*` (`agent.peering` counts fallbacks)


class Reporter:
    """Status writes and Events for one node's LocalModelNode."""

    def __init__(
        self,
        *,
        node_name: str,
        api: launcher.Api,
        wall_clock: Callable[[], datetime.datetime],
    ) -> None:
        self._node_name = node_name
        self._api = api
        self._wall = wall_clock
        self._untrusted_reported: set[str] = set()
        self._events = events.Recorder(
            api,
            component=EVENT_SOURCE,
            instance=node_name,
            host=node_name,
            now=lambda: clock_mod.rfc3339(self._wall()),
        )

    async def write_status(
        self, node_obj: dict[str, Any], desired: dict[str, Any]
    ) -> dict[str, str]:
        """Patch the owned status fields to `desired` when they differ; returns `modelStatus`
        as it was just before (from the object the final diff was made against)."""
        obj = node_obj
        for _ in range(STATUS_WRITE_ATTEMPTS):
            current = status.owned(obj.get("status"))
            before = status.previous_states(current)
            patch = patch_mod.merge_patch(current, desired)
            if not patch:
                return before
            version = (obj.get("metadata") or {}).get("resourceVersion")
            body = {"metadata": {"resourceVersion": version}, "status": patch}
            try:
                await self._api.patch_status(LMN_RESOURCE, self._node_name, body)
            except errors.Conflict:
                log.debug("status_conflict_rereading")
                obj = await self._api.get_status(LMN_RESOURCE, self._node_name)
                continue
            log.debug("status_patched", fields=sorted(patch))
            return before
        raise errors.Conflict(409, f"LocalModelNode {self._node_name}: status kept changing")

    async def record_jobs(
        self, node_obj: dict[str, Any], jobs: list[modelnode.DownloadJob]
    ) -> dict[str, Any]:
        """Patch `downloadJobs` alone (right after a create, so that a crash later in the
        pass loses no record), carrying the resourceVersion; returns the patched object."""
        body_status = {"downloadJobs": [j.to_dict() for j in jobs]}
        obj = node_obj
        for _ in range(STATUS_WRITE_ATTEMPTS):
            version = (obj.get("metadata") or {}).get("resourceVersion")
            body = {"metadata": {"resourceVersion": version}, "status": body_status}
            try:
                return await self._api.patch_status(LMN_RESOURCE, self._node_name, body)
            except errors.Conflict:
                log.debug("status_conflict_rereading")
                obj = await self._api.get_status(LMN_RESOURCE, self._node_name)
        raise errors.Conflict(409, f"LocalModelNode {self._node_name}: status kept changing")

    async def untrusted_jobs(
        self, node: modelnode.LocalModelNode, untrusted: list[dict[str, Any]]
    ) -> None:
        """Log and post an Event, once per Job and process, for each Job that looks like a
        download Job of this node but is not one the agent created (`agent.jobs.trust`); it is
        never deleted. Only uids still seen are remembered."""
        uids = {str((o.get("metadata") or {}).get("uid") or "") for o in untrusted}
        self._untrusted_reported &= uids
        for obj in untrusted:
            meta = obj.get("metadata") or {}
            uid = str(meta.get("uid") or "")
            if uid in self._untrusted_reported or meta.get("deletionTimestamp"):
                continue
            self._untrusted_reported.add(uid)
            job = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
            log.warning("untrusted_download_job", job=job, uid=uid)
            message = (
                f"Job {job} (uid {uid}) carries this node's download Job labels but was not "
                "created by this agent (or was created just before it restarted); it is "
                "ignored, not deleted"
            )
            namespace = str(meta.get("namespace") or "")
            await self.event(node, "Warning", "UntrustedDownloadJob", message, spam_key=namespace)

    async def transition(self, node: modelnode.LocalModelNode, change: status.Transition) -> None:
        """The Event for an entry that became Downloaded or failed."""
        if change.status is modelnode.ModelStatus.DOWNLOADED:
            message = f"model {change.status_key} is downloaded"
            await self.event(node, "Normal", "ModelDownloaded", message, spam_key=change.status_key)
        else:
            message = f"model {change.status_key}: {change.message}"
            stalled = change.message.startswith(stall.STALLED)
            reason = stall.STALLED if stalled else "ModelDownloadFailed"
            await self.event(node, "Warning", reason, message, spam_key=change.status_key)

    async def event(
        self,
        node: modelnode.LocalModelNode,
        kind: str,
        reason: str,
        message: str,
        *,
        spam_key: str | None = None,
    ) -> None:
        """An Event about the node's LocalModelNode; `spam_key` (the cache, the namespace a
        tenant controls) keeps one tenant's Events from using up the node's budget."""
        involved = events.involved_object(
            api_version=LMN.api_version,
            kind=LMN.kind,
            name=self._node_name,
            uid=node.metadata.uid or "",
        )
        try:
            await self._events.record(
                involved,
                type=kind,
                reason=reason,
                message=plan.clip(message),
                namespace=EVENT_NAMESPACE,
                spam_key=f"{reason}/{spam_key}" if spam_key else reason,
            )
        except errors.LocalcacheError as exc:
            log.warning("event_not_posted", reason=reason, error=str(exc))
