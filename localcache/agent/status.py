"""The agent's status writes: what a LocalModelNode's status should say, and the JSON merge
patch that gets it there. Pure functions; `reconciler.py` sends the patch.

The agent owns five fields of `LocalModelNode.status`: KServe's `modelStatus` and
localcache's additive `modelProgress`, `summary`, `downloadJobs` (the records of the
Jobs it created, `agent.jobs.trust`; `localcache.api.modelnode`) and `peer` (what it serves
to peers, `agent.peerfiles`: absent unless peer distribution is enabled). Any other
status field is left as it is. `runtime.patch.merge_patch(current, desired)` is the RFC 7386
patch that turns `current` into `desired` (removed keys become `null`), so a
status-subresource patch carrying the object's resourceVersion is a conflict-safe write of
exactly what changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from localcache.api import modelnode

OWNED_FIELDS: Final = ("modelStatus", "modelProgress", "summary", "downloadJobs", "peer")

ModelStatus = modelnode.ModelStatus


@dataclass(frozen=True, slots=True)
class Outcome:
    """One download unit's result in a pass: its state, its detail, and when to look again."""

    status: ModelStatus
    progress: modelnode.ModelProgress
    requeue_after: float | None = None


def desired_status(
    outcomes: Mapping[str, Outcome], *, jobs: Sequence[modelnode.DownloadJob] = ()
) -> dict[str, Any]:
    """The owned status fields for these outcomes, keyed by status key, and the records of
    the download Jobs the agent created (`downloadJobs` left out when there are none)."""
    states = {key: o.status for key, o in outcomes.items()}
    desired: dict[str, Any] = {
        "modelStatus": {key: state.value for key, state in states.items()},
        "modelProgress": {key: o.progress.to_dict() for key, o in outcomes.items()},
        "summary": modelnode.ModelSummary.of(states).to_dict(),
    }
    if jobs:
        desired["downloadJobs"] = [j.to_dict() for j in jobs]
    return desired


def owned(status: Mapping[str, Any] | None) -> dict[str, Any]:
    """The owned fields of a status as it is now (absent fields left out)."""
    status = status or {}
    return {k: status[k] for k in OWNED_FIELDS if k in status and status[k] is not None}


def previous_states(status: Mapping[str, Any] | None) -> dict[str, str]:
    """`modelStatus` of a status object ({} when absent)."""
    return dict((status or {}).get("modelStatus") or {})


def previous_progress(status: Mapping[str, Any] | None) -> dict[str, modelnode.ModelProgress]:
    """`modelProgress` of a status object, parsed; unreadable entries are skipped."""
    out: dict[str, modelnode.ModelProgress] = {}
    for key, value in ((status or {}).get("modelProgress") or {}).items():
        try:
            out[key] = modelnode.ModelProgress.model_validate(value)
        except ValueError:
            continue
    return out


@dataclass(frozen=True, slots=True)
class Transition:
    """An entry that reached a final state in this pass (for an Event)."""

    status_key: str
    status: ModelStatus
    message: str


def transitions(before: Mapping[str, str], outcomes: Mapping[str, Outcome]) -> list[Transition]:
    """Entries that became Downloaded or DownloadError since `before`."""
    final = (ModelStatus.DOWNLOADED, ModelStatus.DOWNLOAD_ERROR)
    return [
        Transition(key, o.status, o.progress.message or "")
        for key, o in outcomes.items()
        if o.status in final and before.get(key) != o.status.value
    ]
