"""A cache's status from its member nodes: `nodeStatus`, `copies`, `Ready`/`Degraded`, events.

Pure rules, no I/O. Inputs are the cache's current member nodes (with readiness), the
download state (and progress) its status key has on each node's LocalModelNode, and the
derived objects (PV, PVC) the apiserver refused in this reconcile, and the wanted names held by
objects that are not provably the cache's (`NameTaken`).

- `nodeStatus` has exactly one entry per current member node [P7]: `NodeNotReady` for a
  node that is not Ready, whatever it had before [P8]; otherwise the LocalModelNode's
  state mapped one to one (missing or unknown → `NodeDownloadPending`), except that a
  *retry after a failure* stays `NodeDownloadError` until it succeeds: the agent turns the
  entry back to Pending/Downloading while the next attempt runs, and a cache must not look
  recovered merely because a retry started. The agent gives no explicit signal for it; the
  read-side rule (`is_retry_after_failure`) is an entry not yet downloaded whose
  `modelProgress` shows a later attempt (`attempts` > 1) that carries a failure `message`
  (the agent keeps the last failure message while retrying, and clears it when it
  re-downloads a lost folder, which is no failure).
- `copies` counts over those entries only: `total` members, `available` downloaded, `failed`
  download errors (retries after a failure included). All three are written, zeros included.
- Conditions (metav1.Condition shape): `Ready` is True when there is at least one member,
  every member has the model and no node group is missing. `Degraded` is True when a node
  group is missing [P5], the apiserver refused a derived object (`VolumeRefused`, with its
  code, reason and message), a wanted PV/PVC name is held by an object that is not the
  cache's (`VolumeNameTaken`, naming it, why, and what to do), the cache's entry is left out
  of some member node's LocalModelNode by a budget (`NodeEntryOverBudget`, naming the nodes
  and the budget: security review finding 5), or some download failed
  (`DownloadFailed`, naming the nodes, the ones retrying, and the first failure message); the
  reason is the first of these that applies, the message lists them all.
  `lastTransitionTime` changes only when a condition's status changes; reason and message
  may change without it.
- `events` lists what deserves a Kubernetes Event when the status moves from `old` to `new`:
  a node finishing or failing its download, a derived object newly refused, a name newly
  found taken or an entry newly left out, and `Ready`/`Degraded` changing (so `Recovered`
  only once nothing fails any more).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from localcache.api import meta, modelcache, modelnode

NodeStatus = modelcache.NodeStatus
ModelStatus = modelnode.ModelStatus

READY: Final = modelcache.CONDITION_READY
DEGRADED: Final = modelcache.CONDITION_DEGRADED

# Reasons (CamelCase, as metav1.Condition requires).
REASON_DOWNLOADED: Final = "ModelDownloaded"
REASON_NODE_GROUP_NOT_FOUND: Final = "NodeGroupNotFound"
REASON_NO_NODES: Final = "NoMemberNodes"
REASON_DOWNLOAD_FAILED: Final = "DownloadFailed"
REASON_NODES_NOT_READY: Final = "NodesNotReady"
REASON_DOWNLOADING: Final = "DownloadInProgress"
REASON_AS_EXPECTED: Final = "AsExpected"
REASON_VOLUME_REFUSED: Final = "VolumeRefused"
REASON_VOLUME_NAME_TAKEN: Final = "VolumeNameTaken"
REASON_VOLUME_ADOPTED: Final = "VolumeAdopted"
REASON_OVER_BUDGET: Final = "NodeEntryOverBudget"

MAX_NAMES_IN_MESSAGE: Final = 5
MAX_REFUSALS_IN_MESSAGE: Final = 3
DETAIL_LIMIT: Final = 400

_FROM_MODEL_STATUS: Final = {
    ModelStatus.DOWNLOAD_PENDING: NodeStatus.DOWNLOAD_PENDING,
    ModelStatus.DOWNLOADING: NodeStatus.DOWNLOADING,
    ModelStatus.DOWNLOADED: NodeStatus.DOWNLOADED,
    ModelStatus.DOWNLOAD_ERROR: NodeStatus.DOWNLOAD_ERROR,
}


def is_retry_after_failure(
    *, model_status: str | None, attempts: int | None, message: str | None
) -> bool:
    """Whether an entry the agent reports as Pending/Downloading is a retry of a failed
    download (module docstring): a later attempt that carries the last failure message."""
    retrying = model_status in (ModelStatus.DOWNLOAD_PENDING, ModelStatus.DOWNLOADING)
    return retrying and (attempts or 0) > 1 and bool(message)


def node_status(
    *,
    ready: bool,
    model_status: str | None,
    attempts: int | None = None,
    message: str | None = None,
) -> NodeStatus:
    """One member node's entry in `status.nodeStatus`; `attempts` and `message` are the
    entry's `modelProgress` fields (a retry after a failure stays an error)."""
    if not ready:
        return NodeStatus.NOT_READY
    if is_retry_after_failure(model_status=model_status, attempts=attempts, message=message):
        return NodeStatus.DOWNLOAD_ERROR
    try:
        return _FROM_MODEL_STATUS.get(ModelStatus(model_status or ""), NodeStatus.DOWNLOAD_PENDING)
    except ValueError:
        return NodeStatus.DOWNLOAD_PENDING


def clip(text: str, limit: int = DETAIL_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class Refusal:
    """The apiserver refused a write of one of the cache's derived objects (a PV or PVC):
    `code` and `reason` are the HTTP status and the Status reason (`Invalid`, `Forbidden`,
    ...), `message` the apiserver's own text."""

    verb: Literal["create", "delete", "patch"]
    kind: str
    name: str
    namespace: str
    code: int
    reason: str
    message: str

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        why = f"{self.code} {self.reason}" if self.reason else str(self.code)
        return f"cannot {self.verb} {self.kind} {where}: {why}: {clip(self.message)}"


@dataclass(frozen=True, slots=True)
class NameTaken:
    """A PV or PVC the cache wants exists under its name but is not provably the cache's
    (`controllers.adoption`): it is left alone. `reason` says why it is not the cache's,
    `remedy` what the user can do."""

    kind: str
    name: str
    namespace: str
    reason: str
    remedy: str

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where} is not this cache's: {self.reason}; {self.remedy}"


def copies(statuses: Mapping[str, NodeStatus]) -> modelcache.ModelCopies:
    values = list(statuses.values())
    return modelcache.ModelCopies(
        total=len(values),
        available=values.count(NodeStatus.DOWNLOADED),
        failed=values.count(NodeStatus.DOWNLOAD_ERROR),
    )


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES_IN_MESSAGE])
    extra = len(names) - MAX_NAMES_IN_MESSAGE
    return f"{shown} and {extra} more" if extra > 0 else shown


def _with(statuses: Mapping[str, NodeStatus], wanted: NodeStatus) -> list[str]:
    return sorted(node for node, state in statuses.items() if state == wanted)


def _group_message(missing: Sequence[str]) -> str:
    noun = "node group" if len(missing) == 1 else "node groups"
    return f"{noun} {_names(missing)} not found"


def _ready(statuses: Mapping[str, NodeStatus], missing: Sequence[str]) -> tuple[bool, str, str]:
    total = len(statuses)
    downloaded = len(_with(statuses, NodeStatus.DOWNLOADED))
    if missing:
        return False, REASON_NODE_GROUP_NOT_FOUND, _group_message(missing)
    if total == 0:
        return False, REASON_NO_NODES, "no node belongs to the cache's node groups"
    if downloaded == total:
        return True, REASON_DOWNLOADED, f"model downloaded on all {total} member nodes"
    progress = f"model downloaded on {downloaded} of {total} member nodes"
    failed = _with(statuses, NodeStatus.DOWNLOAD_ERROR)
    if failed:
        return False, REASON_DOWNLOAD_FAILED, f"{progress}; download failed on {_names(failed)}"
    not_ready = _with(statuses, NodeStatus.NOT_READY)
    if not_ready:
        return False, REASON_NODES_NOT_READY, f"{progress}; not ready: {_names(not_ready)}"
    return False, REASON_DOWNLOADING, progress


def _refusals_message(refused: Sequence[Refusal]) -> str:
    shown = "; ".join(r.describe() for r in refused[:MAX_REFUSALS_IN_MESSAGE])
    extra = len(refused) - MAX_REFUSALS_IN_MESSAGE
    return f"{shown}; and {extra} more refused" if extra > 0 else shown


def _taken_message(taken: Sequence[NameTaken]) -> str:
    shown = "; ".join(t.describe() for t in taken[:MAX_REFUSALS_IN_MESSAGE])
    extra = len(taken) - MAX_REFUSALS_IN_MESSAGE
    return f"{shown}; and {extra} more names taken" if extra > 0 else shown


def over_budget_message(over_budget: Mapping[str, str]) -> str:
    """What `Degraded` says of entries left out of nodes (node → the budget's reason)."""
    nodes = sorted(over_budget)
    return f"left out of the LocalModelNode of {_names(nodes)}: {over_budget[nodes[0]]}"


def _failures_message(
    failed: Sequence[str], retrying: Collection[str], details: Mapping[str, str]
) -> str:
    text = f"download failed on {_names(failed)}"
    again = [node for node in failed if node in retrying]
    if again:
        text += f" (retry running on {_names(again)})"
    first = next((node for node in failed if details.get(node)), None)
    if first is not None:
        text += f"; {first}: {clip(details[first])}"
    return text


def _degraded(
    statuses: Mapping[str, NodeStatus],
    missing: Sequence[str],
    *,
    refused: Sequence[Refusal],
    taken: Sequence[NameTaken],
    retrying: Collection[str],
    details: Mapping[str, str],
    over_budget: Mapping[str, str],
) -> tuple[bool, str, str]:
    failed = _with(statuses, NodeStatus.DOWNLOAD_ERROR)
    parts = []
    reasons = []
    if missing:
        parts.append(_group_message(missing))
        reasons.append(REASON_NODE_GROUP_NOT_FOUND)
    if refused:
        parts.append(_refusals_message(refused))
        reasons.append(REASON_VOLUME_REFUSED)
    if taken:
        parts.append(_taken_message(taken))
        reasons.append(REASON_VOLUME_NAME_TAKEN)
    if over_budget:
        parts.append(over_budget_message(over_budget))
        reasons.append(REASON_OVER_BUDGET)
    if failed:
        parts.append(_failures_message(failed, retrying, details))
        reasons.append(REASON_DOWNLOAD_FAILED)
    if not parts:
        return False, REASON_AS_EXPECTED, "no download failed and every node group exists"
    return True, reasons[0], "; ".join(parts)


def _find(conds: Sequence[meta.Condition], type_: str) -> meta.Condition | None:
    return next((c for c in conds if c.type == type_), None)


def set_condition(
    previous: Sequence[meta.Condition],
    *,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: str,
) -> meta.Condition:
    """The condition to write: `lastTransitionTime` kept when the status did not change
    (apimachinery's `SetStatusCondition`)."""
    new_status = meta.ConditionStatus.TRUE if status else meta.ConditionStatus.FALSE
    old = _find(previous, type_)
    since = old.last_transition_time if old is not None and old.status == new_status else now
    return meta.Condition(
        type=type_,
        status=new_status,
        observed_generation=generation,
        last_transition_time=since,
        reason=reason,
        message=message,
    )


def conditions(
    statuses: Mapping[str, NodeStatus],
    *,
    missing_groups: Sequence[str],
    previous: Sequence[meta.Condition] | None,
    generation: int | None,
    now: str,
    refused: Sequence[Refusal] = (),
    taken: Sequence[NameTaken] = (),
    retrying: Collection[str] = (),
    failure_messages: Mapping[str, str] | None = None,
    over_budget: Mapping[str, str] | None = None,
) -> list[meta.Condition]:
    """`Ready` then `Degraded`, followed by any other condition types already present.
    `refused` are this reconcile's refused derived objects, `taken` the wanted names held by
    objects that are not the cache's, `retrying` the member nodes whose failed download is
    being retried, `failure_messages` the agent's text per node, `over_budget` the member
    nodes whose LocalModelNode leaves the cache's entry out, with the reason."""
    prior = list(previous or [])
    out = []
    degraded = _degraded(
        statuses,
        missing_groups,
        refused=refused,
        taken=taken,
        retrying=retrying,
        details=failure_messages or {},
        over_budget=over_budget or {},
    )
    for type_, (status, reason, message) in (
        (READY, _ready(statuses, missing_groups)),
        (DEGRADED, degraded),
    ):
        out.append(
            set_condition(
                prior,
                type_=type_,
                status=status,
                reason=reason,
                message=message,
                generation=generation,
                now=now,
            )
        )
    out.extend(c for c in prior if c.type not in (READY, DEGRADED))
    return out


# ------------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class EventSpec:
    """A Kubernetes Event to record on the cache."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def events(
    *,
    old_nodes: Mapping[str, NodeStatus],
    new_nodes: Mapping[str, NodeStatus],
    old_conditions: Sequence[meta.Condition],
    new_conditions: Sequence[meta.Condition],
    failure_messages: Mapping[str, str] | None = None,
    refused: Sequence[Refusal] = (),
    taken: Sequence[NameTaken] = (),
    over_budget: Mapping[str, str] | None = None,
) -> list[EventSpec]:
    """Events for a status change: downloads completed or failed on a node (only when the
    node's state changed to that), derived objects refused and names taken that the old
    `Degraded` message did not already report, and `Ready`/`Degraded` transitions.
    `failure_messages` (node → text) adds the agent's reason to a failure event."""
    out: list[EventSpec] = []
    details = failure_messages or {}
    old_degraded = _find(old_conditions, DEGRADED)
    reported = old_degraded.message if old_degraded is not None else ""
    for refusal in refused:
        text = refusal.describe()
        if text not in reported:
            out.append(EventSpec("Warning", REASON_VOLUME_REFUSED, text))
    for holder in taken:
        text = holder.describe()
        if text not in reported:
            out.append(EventSpec("Warning", REASON_VOLUME_NAME_TAKEN, text))
    if over_budget and (text := over_budget_message(over_budget)) not in reported:
        out.append(EventSpec("Warning", REASON_OVER_BUDGET, text))
    for node in sorted(new_nodes):
        state = new_nodes[node]
        if old_nodes.get(node) == state:
            continue
        if state == NodeStatus.DOWNLOADED:
            out.append(EventSpec("Normal", REASON_DOWNLOADED, f"model downloaded on node {node}"))
        elif state == NodeStatus.DOWNLOAD_ERROR:
            text = f"model download failed on node {node}"
            if details.get(node):
                text += f": {details[node]}"
            out.append(EventSpec("Warning", REASON_DOWNLOAD_FAILED, text))
    for type_ in (READY, DEGRADED):
        old = _find(old_conditions, type_)
        new = _find(new_conditions, type_)
        if new is None or (old is not None and old.status == new.status):
            continue
        if old is None and new.status != meta.ConditionStatus.TRUE:
            continue  # the first status of a new cache is not news
        kind, reason = _TRANSITION_EVENTS[(type_, new.status == meta.ConditionStatus.TRUE)]
        out.append(EventSpec(kind, reason, f"{new.reason}: {new.message}"))
    return out


_TRANSITION_EVENTS: Final[dict[tuple[str, bool], tuple[Literal["Normal", "Warning"], str]]] = {
    (READY, True): ("Normal", "Ready"),
    (READY, False): ("Warning", "NotReady"),
    (DEGRADED, True): ("Warning", "Degraded"),
    (DEGRADED, False): ("Normal", "Recovered"),
}
