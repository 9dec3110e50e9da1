"""Where a download unit's next Job fetches from, when its node group enables peer
distribution: the peer planner. Pure: plain data in (`Request`), a decision out (`plan`).

For a unit (storage key K, credential scope digest S) about to launch on node `me`, from the
LocalModelNodes of its node group (`members`):
- after a failed peer attempt -> `Origin` (a peer-mode pod that exits "use origin" is retried
  at once in origin mode, never twice by peers);
- *sources*: other nodes with a `status.peer.endpoint` (https) and a `status.peer.models`
  entry for K whose `scopes` contain S; ranked by fewest children (a child is an entry of a
  group node, Pending or Downloading, whose `modelProgress.source` is `peer/<that node>`),
  then name; nodes with `maxUploads` children or more are skipped; at most
  `peer.MAX_SOURCES` are kept, all with the best one's digest -> `Peer(sources, digest)`;
- else, for a `provable` unit (an `s3://` model, `proofOrigins` named), nodes holding K
  complete for other scopes, ranked and capped the same way -> `Peer(sources, digest,
  prove=True)`: the fetcher proves access at the origin first (`agent.peer.proofs`);
- else *nodes still downloading K* in scope S (a `complete: false` entry: they serve their
  whole files), ranked and capped the same way, never a node whose own entry fetches from
  `me` (no cycle) -> `Peer(sources, peer.FOLLOW)`;
- else a *seed* to wait for: another node downloading K in scope S from the origin (a record
  in its `status.downloadJobs` for K and S whose entry is Pending or Downloading with source
  `origin`), else the elected seed: the lowest node name among the members whose spec lists
  the same status key, not in ModelDownloadError (nor Downloaded without ever being able to
  serve this scope, nor Downloaded and listing the key in `status.peer.unservable`); when
  that is not `me` -> `WaitForSeed(node, message, progress)`, until the seed's entry has not
  moved (`SeedProgress.moved_from`: another Job, Downloaded, more bytes than ever seen of
  its Job) for `seed_wait_s` (a Downloaded seed, which hashes its folder before it serves,
  for that plus its bytes at `HASH_FLOOR_BPS`, at most `HASH_MAX_S` more:
  `SeedProgress.idle_limit`), or the unit has
  waited `seed_max_wait_s` -> `Origin(
  "seed-wait-timeout")`, or, once it has waited `seed_start_s` for this elected seed
  (`seed_clock`) whose entry is still neither Downloading nor Downloaded, `Origin(
  "seed-not-started")` (its agent is down, or it cannot launch its Job); when it
  is `me` but no other member lists the status key yet, a `WaitForSeed(me)` of `SETTLE_S`
  first (the controller writes the group's specs concurrently: a node deciding before the
  others' specs exist would elect itself while a lower-named node does the same a moment
  later);
- else -> `Origin`.

Other nodes' statuses are written by their agents; tenants cannot write them. The planner
still bounds what it reads (endpoints must be https URLs of bounded length).
Not promised: that a source can serve (the fetcher falls back to the next source, then to
the origin), nor that a seed ever finishes (the wait ends once its entry stops moving for
`seed_wait_s`, and after `SEED_MAX_WAIT_S` in any case).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from localcache.api import modelnode, peer

ModelStatus = modelnode.ModelStatus

SOURCE_ORIGIN: Final = "origin"
SOURCE_PEER_PREFIX: Final = "peer/"
MAX_ENDPOINT: Final = 128
SETTLE_S: Final = 1.0
SEED_START_S: Final = 60.0
SEED_MAX_WAIT_S: Final = 6 * 3600.0
"""However long a seed's download moves, a follower waits for it at most this long."""
HASH_FLOOR_BPS: Final = 32 << 20
"""The slowest hashing rate a Downloaded seed is allowed (a slow disk): it hashes its whole
folder before it serves it, and nothing of its entry moves meanwhile."""
HASH_MAX_S: Final = 2 * 3600.0
"""The most a Downloaded seed's hashing adds to the wait (its size is its files' apparent
size: a sparse file must not hold its followers for hours)."""
SETTLE_MESSAGE: Final = "waiting a moment for the other nodes of the group before the origin"
SEED_FALLBACKS: Final = {
    "seed-wait-timeout": "the seed's download did not move in time",
    "seed-not-started": "the elected seed never began its download",
}
"""The `Origin` reasons that end a wait for a seed, and what they mean (a fallback)."""
_IN_FLIGHT: Final = frozenset({ModelStatus.DOWNLOAD_PENDING, ModelStatus.DOWNLOADING})


@dataclass(frozen=True, slots=True)
class SeedProgress:
    """What moves while a seed downloads: its entry's state, Job and bytes on disk."""

    state: str = ""
    job: str = ""
    bytes: int = 0

    def moved_from(self, before: SeedProgress | None, most: int) -> bool:
        """Another Job (a retry), the model Downloaded, or more bytes than the `most` seen
        of this Job: never a flap back to fewer bytes or between Pending and Downloading."""
        if before is None or self.job != before.job:
            return True
        done = self.state == ModelStatus.DOWNLOADED and before.state != self.state
        return done or self.bytes > most

    def idle_limit(self, seed_wait_s: float) -> float:
        """How long this entry may stay unmoved: `seed_wait_s`, plus the time to hash its
        bytes at `HASH_FLOOR_BPS` once Downloaded (it serves only once hashed)."""
        if self.state != ModelStatus.DOWNLOADED:
            return seed_wait_s
        return seed_wait_s + min(self.bytes / HASH_FLOOR_BPS, HASH_MAX_S)


@dataclass(frozen=True, slots=True)
class SeedClock:
    """What a unit saw of the seed it waited for last: since when it was awaited
    (`elected_s`: the `seed_start_s` count), since when its entry last moved (`idle_s`: the
    `seed_wait_s` count), its last `SeedProgress` and the most bytes seen of that Job."""

    seed: str = ""
    elected_s: float = 0.0
    idle_s: float = 0.0
    last: SeedProgress | None = None
    most: int = 0


@dataclass(frozen=True, slots=True)
class Request:
    """What the planner reads about one unit about to launch."""

    storage_key: str
    scope: str
    """The unit's scope digest (`downloads.Unit.scope_id`)."""
    node_name: str
    status_key: str
    """The unit's leader entry's status key (seed election)."""
    spec: peer.PeerDistributionSpec
    members: Sequence[modelnode.LocalModelNode]
    """The group's LocalModelNodes (this node's own may be among them)."""
    previous_peer_failed: bool = False
    provable: bool = False
    """The unit may prove access at the origin to a node of another scope (an `s3://` model
    in a group that names `proofOrigins`)."""
    waited_s: float = 0.0
    """How long this unit has already waited for a seed."""
    seed_wait_s: float = 300.0
    seed_start_s: float = SEED_START_S
    """How long an elected seed may show no download (Downloading or Downloaded) at all."""
    seed_clock: SeedClock = field(default_factory=SeedClock)
    """What this unit saw of the seed it waited for last (`agent.peerwait`)."""
    seed_max_wait_s: float = SEED_MAX_WAIT_S


@dataclass(frozen=True, slots=True)
class Origin:
    """Download from the origin; `reason` says why not from peers (for logs and metrics)."""

    reason: str = "no-source"


@dataclass(frozen=True, slots=True)
class Peer:
    """Fetch from `sources` ((node, endpoint), best first), all serving `digest`."""

    sources: tuple[tuple[str, str], ...]
    digest: str
    prove: bool = False
    """The sources hold the model for other scopes: the fetcher proves access first."""

    @property
    def source(self) -> str:
        """`ModelProgress.source` for this attempt."""
        return SOURCE_PEER_PREFIX + self.sources[0][0]


@dataclass(frozen=True, slots=True)
class WaitForSeed:
    """Another node fetches the model from the origin first: wait for it while it moves
    (`progress`: its entry now; none while settling)."""

    node: str
    message: str
    progress: SeedProgress | None = None


Decision = Origin | Peer | WaitForSeed


def plan(request: Request) -> Decision:
    """The decision for `request` (see the module docstring)."""
    if request.previous_peer_failed:
        return Origin("peer-failed")
    others = sorted(
        (n for n in request.members if n.name != request.node_name), key=lambda n: n.name
    )
    found = sources(request, others)
    if found is not None:
        return found
    downloading = _downloading(request, others)
    seed = downloading[0] if downloading else _elected(request)
    if seed is None or seed == request.node_name:
        if _alone(request, others) and request.waited_s < SETTLE_S:
            # the specs of a group's nodes are written at about the same time: a node that
            # sees no other yet waits a moment, or two nodes would each elect themselves
            return WaitForSeed(request.node_name, SETTLE_MESSAGE)
        return Origin("no-source")
    clock = request.seed_clock if request.seed_clock.seed == seed else SeedClock(seed)
    now = _progress(request, seed, downloading[1] if downloading else request.status_key)
    idle = 0.0 if now.moved_from(clock.last, clock.most) else clock.idle_s
    if idle >= now.idle_limit(request.seed_wait_s) or request.waited_s >= request.seed_max_wait_s:
        return Origin("seed-wait-timeout")  # its entry has not moved for that long
    began = now.state in (ModelStatus.DOWNLOADING, ModelStatus.DOWNLOADED)
    if (
        downloading is None
        and clock.elected_s >= min(request.seed_start_s, request.seed_wait_s)
        and not began
    ):
        return Origin("seed-not-started")  # its agent is down, or it cannot launch
    message = (
        f"waiting for node {seed} to download the model from the origin, then fetching it "
        f"from peers (while its download moves; {int(now.idle_limit(request.seed_wait_s))}s "
        "without a change and this node uses the origin)"
    )
    return WaitForSeed(seed, message, now)


def children(members: Sequence[modelnode.LocalModelNode]) -> dict[str, int]:
    """Per node name, how many entries of `members` fetch from it now."""
    counts: dict[str, int] = {}
    for node in members:
        st = node.status
        if st is None:
            continue
        states = st.model_status or {}
        for key, progress in (st.model_progress or {}).items():
            source = progress.source or ""
            if states.get(key) in _IN_FLIGHT and source.startswith(SOURCE_PEER_PREFIX):
                parent = source[len(SOURCE_PEER_PREFIX) :]
                counts[parent] = counts.get(parent, 0) + 1
    return counts


def sources(request: Request, others: Sequence[modelnode.LocalModelNode]) -> Peer | None:
    """The ranked sources for the unit, all with the best one's digest; else the nodes still
    downloading it in its scope (digest `peer.FOLLOW`); None: no source."""
    load = children(request.members)
    ranked: list[tuple[int, str, str, str]] = []  # children, name, endpoint, digest
    following: list[tuple[int, str, str, str]] = []
    provable: list[tuple[int, str, str, str]] = []  # complete for another scope
    for node in others:
        count = load.get(node.name, 0)
        if count >= request.spec.max_uploads:
            continue
        endpoint, model = _serves(node, request.storage_key, request.scope)
        if endpoint is not None and model is not None:
            if model.whole and model.digest:
                ranked.append((count, node.name, endpoint, model.digest))
            elif _source_of(node, request.status_key) != SOURCE_PEER_PREFIX + request.node_name:
                following.append((count, node.name, endpoint, peer.FOLLOW))  # never a cycle
        if request.provable:
            endpoint, model = _serves(node, request.storage_key)
            if endpoint is not None and model is not None and model.whole and model.digest:
                provable.append((count, node.name, endpoint, model.digest))
    # a complete copy of another scope now, rather than following our own download
    prove = not ranked and bool(provable)
    ranked = ranked or provable or following
    if not ranked:
        return None
    ranked.sort(key=lambda r: (r[0], r[1]))
    digest = ranked[0][3]
    chosen = tuple((name, endpoint) for _c, name, endpoint, d in ranked if d == digest)
    return Peer(chosen[: peer.MAX_SOURCES], digest, prove)


def valid_endpoint(endpoint: str | None) -> bool:
    """An endpoint the planner hands to a fetcher: https, bounded, no whitespace."""
    return (
        bool(endpoint)
        and endpoint is not None
        and len(endpoint) <= MAX_ENDPOINT
        and endpoint.startswith("https://")
        and not any(c.isspace() or c in "=," for c in endpoint)
    )


def _serves(
    node: modelnode.LocalModelNode, storage_key: str, scope: str | None = None
) -> tuple[str | None, peer.PeerModel | None]:
    """The node's endpoint (None when unusable) and its model entry for `storage_key` (with
    `scope`: one serving it, a complete one first)."""
    status = node.status.peer if node.status is not None else None
    if status is None or not valid_endpoint(status.endpoint):
        return None, None
    found = [m for m in status.models or [] if m.storage_key == storage_key]
    if scope is not None:
        found = [m for m in found if scope in m.scopes]
    found.sort(key=lambda m: not m.whole)
    return status.endpoint, (found[0] if found else None)


def _source_of(node: modelnode.LocalModelNode, status_key: str) -> str:
    progress = (node.status.model_progress or {}) if node.status is not None else {}
    entry = progress.get(status_key)
    return (entry.source or "") if entry is not None else ""


def _downloading(
    request: Request, others: Sequence[modelnode.LocalModelNode]
) -> tuple[str, str] | None:
    """The first other node downloading K in scope S from the origin now, and the status key
    of its entry doing so."""
    for node in others:
        st = node.status
        if st is None:
            continue
        states, progress = st.model_status or {}, st.model_progress or {}
        for record in st.download_jobs or []:
            if (record.storage_key, record.scope) != (request.storage_key, request.scope):
                continue
            entry = progress.get(record.status_key)
            if (
                states.get(record.status_key) in _IN_FLIGHT
                and entry is not None
                and entry.source == SOURCE_ORIGIN
                and entry.job_name == record.name
            ):
                return node.name, record.status_key
    return None


def _elected(request: Request) -> str | None:
    """The lowest-named member listing the status key that may still seed it."""
    candidates = []
    for node in request.members:
        if not any(_status_key(e) == request.status_key for e in node.spec.local_models):
            continue
        st = node.status
        state = (st.model_status or {}).get(request.status_key) if st is not None else None
        if state == ModelStatus.DOWNLOAD_ERROR:
            continue
        if state == ModelStatus.DOWNLOADED and node.name != request.node_name:
            endpoint, model = _serves(node, request.storage_key)
            if endpoint is None or (model is not None and request.scope not in model.scopes):
                continue  # it holds the model but will never serve it to this scope
            if model is None and _unservable(node, request.storage_key):
                continue  # it holds the model and said it cannot serve it
        candidates.append(node.name)
    return min(candidates) if candidates else None


def _unservable(node: modelnode.LocalModelNode, storage_key: str) -> bool:
    status = node.status.peer if node.status is not None else None
    return status is not None and any(u.storage_key == storage_key for u in status.unservable or [])


def _progress(request: Request, seed: str, status_key: str) -> SeedProgress:
    """The seed's entry `status_key` now: state, Job and bytes on disk."""
    for node in request.members:
        if node.name == seed and node.status is not None:
            entry = (node.status.model_progress or {}).get(status_key)
            state = (node.status.model_status or {}).get(status_key)
            return SeedProgress(
                str(state or ""),
                (entry.job_name or "") if entry is not None else "",
                (entry.bytes_on_disk or 0) if entry is not None else 0,
            )
    return SeedProgress()


def _alone(request: Request, others: Sequence[modelnode.LocalModelNode]) -> bool:
    """No other member lists the unit's status key (yet)."""
    return not any(
        _status_key(e) == request.status_key for n in others for e in n.spec.local_models
    )


def _status_key(entry: modelnode.LocalModelInfo) -> str:
    return f"{entry.namespace}/{entry.model_name}" if entry.namespace else entry.model_name
