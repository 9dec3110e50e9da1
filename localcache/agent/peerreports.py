"""What finished peer-mode download pods said, for the agent (issue 23).

A peer-mode pod ends with a `peer.FetchReport` as its termination message. That message is a
tenant's pod output: it is read at most `REPORT_LIMIT` characters, parsed as a `FetchReport` or
ignored, and feeds only this entry's own status numbers, the fast-fallback decision (which can
only send the tenant's own next attempt to the origin) and the bad-source report below.

- `Reports.of(job)`: the newest finished pod's exit code and report (one LIST of the Job's
  pods, cached per Job uid, bounded).
- `Reports.bad_sources(node, job, said)`: each source node the fetcher caught serving bytes that
  fail verification (and banned for the rest of its run) is counted in
  `localcache_p2p_verify_failures_total`, logged, and named in a `PeerSourceRejected` Warning
  Event on this node's LocalModelNode, once per Job. The names come from a tenant's pod: at
  most `peer.MAX_SOURCES + 1` of them, each bounded; a log line, a counter increment and an
  Event (its spam key the Job's namespace, so one tenant cannot use up the node's Event
  budget) is all they can cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import pydantic
import structlog

from localcache.agent import downloads, report
from localcache.agent.jobs import launcher, peerjob
from localcache.api import modelnode, peer
from localcache.runtime import metrics

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
REPORT_LIMIT: Final = 4096
KEPT: Final = 256
EVENT_REASON: Final = "PeerSourceRejected"


@dataclass(frozen=True, slots=True)
class PodReport:
    """What a finished download pod said: its exit code and its parsed `FetchReport`."""

    exit_code: int | None = None
    report: peer.FetchReport | None = None

    @property
    def use_origin(self) -> bool:
        outcome = self.report.outcome if self.report is not None else None
        return self.exit_code == peer.EXIT_USE_ORIGIN or outcome == "use-origin"


class Reports:
    """Reads and remembers peer-mode pods' reports; reports bad sources (module docstring)."""

    def __init__(
        self, api: launcher.Api, reporter: report.Reporter, p2p: metrics.PeerMetrics | None
    ) -> None:
        self._api = api
        self._report = reporter
        self._p2p = p2p
        self._said: dict[str, PodReport] = {}
        self._told: dict[str, None] = {}  # Job uids whose bad sources were reported

    async def of(self, ref: downloads.JobRef) -> PodReport:
        """What the Job's newest finished pod said (cached per Job; empty when unreadable)."""
        if ref.uid in self._said:
            return self._said[ref.uid]
        pods = await launcher.job_pods(self._api, ref)
        if pods is None:
            return PodReport()
        said = read_pod_report(pods)
        self._said[ref.uid] = said
        _trim(self._said)
        return said

    async def bad_sources(
        self, node: modelnode.LocalModelNode, ref: downloads.JobRef, said: PodReport
    ) -> None:
        bad = said.report.bad_sources if said.report is not None else {}
        if not bad or ref.uid in self._told:
            return
        self._told[ref.uid] = None
        _trim(self._told)
        for source, why in bad.items():
            if self._p2p is not None:
                self._p2p.verify_failures.inc()
            log.warning("peer_source_bad_bytes", job=ref.name, source=source, reason=why)
            message = (
                f"peer {source} served bytes that fail verification to download Job "
                f"{ref.namespace}/{ref.name} ({why}); that source was skipped"
            )
            await self._report.event(node, "Warning", EVENT_REASON, message, spam_key=ref.namespace)


def read_pod_report(pods: list[Obj]) -> PodReport:
    """The exit code and `FetchReport` of the newest finished pod's download container."""
    done = [p for p in pods if (p.get("status") or {}).get("phase") in ("Failed", "Succeeded")]
    done.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    for pod in reversed(done):
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            if not isinstance(container, dict) or container.get("name") != peerjob.CONTAINER:
                continue
            term = (container.get("state") or {}).get("terminated") or {}
            code = term.get("exitCode")
            return PodReport(
                exit_code=code if isinstance(code, int) else None,
                report=parse_report(term.get("message")),
            )
    return PodReport()


def parse_report(text: object) -> peer.FetchReport | None:
    """A `FetchReport` from a termination message (None for anything else)."""
    if not isinstance(text, str) or not text.strip() or len(text) > REPORT_LIMIT:
        return None
    try:
        return peer.FetchReport.model_validate_json(text.strip())
    except (pydantic.ValidationError, ValueError):
        return None


def _trim(kept: dict[str, Any]) -> None:
    while len(kept) > KEPT:
        kept.pop(next(iter(kept)))
