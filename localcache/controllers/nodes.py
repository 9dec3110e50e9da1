"""LocalModelNode maintenance: bring nodes' `spec.localModels` to the desired entries.

One `LocalModelNodes` writer serves every reconciler of the process. Its contract:
- The desired list of a node (`placement.Snapshot.desired_entries`) covers every cache of
  both kinds, keyed by (namespace, modelName), and the whole list is written. It is computed
  from the stores *at the moment of each write attempt*, together with the current object,
  never from an older snapshot: so a write can never undo an entry that a writer with a
  newer view already added, and no cache's entry is lost [P10].
- Writes are compare-and-swap: a merge patch carrying the `resourceVersion` of the object
  it was computed from. On `Conflict` the object is read from the API and everything is
  recomputed, up to `MAX_ATTEMPTS` times; then the Conflict is raised (the reconcile is
  retried with backoff).
- Writes to one node are serialised within the process (a lock per node), and the object a
  write returned stands in for the store's copy until the store has moved past the version
  the write replaced, so back-to-back writes from this process do not conflict.
  `settled()` waits for the writes already started (used before a finalizer lists entries).
- Nothing is written when the object already matches (entries compared by their fields, in
  any order; unknown fields and the order of kept entries are preserved); the comparison of
  an unchanged object is memoised per resourceVersion.
- A LocalModelNode is created only for a node that should hold something, with an
  ownerReference to its Node, so the garbage collector deletes it with the node; one missing
  that reference (or naming an older Node uid) gets it. An emptied one is kept with an empty
  list (its agent then cleans up).
- Nodes that are not in the Node store are never written (their LocalModelNode is on its
  way out through garbage collection), except by `drop_entry`, which only removes one entry.
- Per-node state (the lock, the last written object) of a node that left the Node store is
  forgotten at the next `sync` (`forget_gone`), so deleted nodes do not accumulate; a node
  that comes back starts afresh from the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import structlog

from localcache.api import groupversion
from localcache.caching import entries, indexes, placement
from localcache.controllers import state
from localcache.runtime import errors, store
from localcache.runtime import keys as runtime_keys
from localcache.runtime import store as store_mod

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
MAX_ATTEMPTS: Final = 5
CONCURRENCY: Final = 8
"""LocalModelNodes written at once by one call of `sync`."""


def node_owner_reference(node: Obj) -> Obj:
    meta = node.get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Node", "name": meta.get("name"), "uid": meta.get("uid")}


def _owner_references(current: Obj, node: Obj) -> list[Obj] | None:
    """The ownerReferences with the right Node reference, or None when already right."""
    want = node_owner_reference(node)
    refs = list((current.get("metadata") or {}).get("ownerReferences") or [])
    others = [r for r in refs if not (r.get("kind") == "Node" and r.get("apiVersion") == "v1")]
    mine = [r for r in refs if r not in others]
    if len(mine) == 1 and mine[0].get("name") == want["name"] and mine[0].get("uid") == want["uid"]:
        return None
    return [*others, want]


def _rv(obj: Obj | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def new_object(node: Obj, desired: entries.Desired) -> Obj:
    """A LocalModelNode for `node` listing `desired`, owned by the Node."""
    wanted = desired.entries
    return {
        "apiVersion": groupversion.LOCAL_MODEL_NODE.api_version,
        "kind": groupversion.LOCAL_MODEL_NODE.kind,
        "metadata": {
            "name": state.name_of(node),
            "labels": {state.MANAGED_BY_LABEL: state.MANAGED_BY},
            "ownerReferences": [node_owner_reference(node)],
        },
        "spec": {"localModels": [dict(wanted[k]) for k in sorted(wanted)]},
    }


class SignatureMemo:
    """Signatures of stored `spec.localModels` lists by (name, resourceVersion)."""

    def __init__(self, limit: int = 10_000) -> None:
        self._limit = limit
        self._memo: dict[tuple[str, str], entries.Signature] = {}

    def of(self, obj: Obj) -> entries.Signature:
        key = (state.name_of(obj), _rv(obj))
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= self._limit:
                self._memo.clear()
            listed = (obj.get("spec") or {}).get("localModels") or []
            found = self._memo[key] = entries.signature(listed)
        return found


def patch_for(
    current: Obj,
    node: Obj | None,
    desired: entries.Desired,
    memo: SignatureMemo | None = None,
) -> Obj | None:
    """The compare-and-swap merge patch from `current` to `desired`, or None when equal.
    Without `node` the ownerReferences are left as they are."""
    current_entries = (current.get("spec") or {}).get("localModels") or []
    merged = entries.merge_entries(
        current_entries,
        desired,
        current_signature=memo.of(current) if memo is not None else None,
    )
    refs = _owner_references(current, node) if node is not None else None
    if merged is None and refs is None:
        return None
    meta: Obj = {"resourceVersion": _rv(current)}
    patch: Obj = {"metadata": meta}
    if refs is not None:
        meta["ownerReferences"] = refs
    if merged is not None:
        patch["spec"] = {"localModels": merged}
    return patch


class LocalModelNodes:
    """The process's LocalModelNode writer (see the module docstring)."""

    def __init__(
        self,
        api: state.Api,
        *,
        store: store.Reader,
        snapshot: Callable[[], placement.Snapshot],
    ) -> None:
        self._api = api
        self._store = store
        self._snapshot = snapshot
        self._locks: dict[str, asyncio.Lock] = {}
        # by node name: the object our last write returned, over the version it replaced
        self._written: store_mod.WriteOverlay[str, Obj] = store_mod.WriteOverlay()
        self._in_flight: set[asyncio.Future[None]] = set()
        self.signatures = SignatureMemo()

    async def settled(self) -> None:
        """Wait for every write that has started so far (later ones read the stores as they
        are then). A finalizer calls this before listing entries: whatever a write computed
        before the cache was marked for deletion has landed by the time it lists."""
        pending = list(self._in_flight)
        if pending:
            await asyncio.wait(pending)

    def current(self, name: str) -> Obj | None:
        """The freshest copy known: the store's, or the object our last write returned
        while the store still shows the version that write replaced."""
        stored = self._store.get(runtime_keys.ObjectKey("", name))
        written = self._written.get(name, stored_version=_rv(stored))
        return written if written is not None else stored

    def needs_write(self, name: str, snap: placement.Snapshot) -> bool:
        """Whether node `name` differs from its desired state in `snap` (no request)."""
        node = snap.nodes.get(name)
        if node is None:
            return False
        current = self.current(name)
        desired = snap.desired_entries(name)
        if current is None:
            return len(desired) > 0
        return patch_for(current, node, desired, self.signatures) is not None

    async def sync(
        self,
        names: Iterable[str],
        snap: placement.Snapshot,
        *,
        listed: Mapping[str, Obj] | None = None,
    ) -> int:
        """Bring every named node that `snap` says differs to its desired state (recomputed
        at write time), `CONCURRENCY` at a time. `listed` objects (fresh from a LIST) are
        preferred as first guesses. Returns how many were written; raises the first failure
        after trying them all."""
        self.forget_gone(snap)
        fresh = listed or {}
        todo = [
            name
            for name in sorted(set(names))
            if (name in fresh and name in snap.nodes) or self.needs_write(name, snap)
        ]
        if not todo:
            return 0
        limit = asyncio.Semaphore(CONCURRENCY)
        failures: list[Exception] = []
        written = 0

        async def one(name: str) -> None:
            nonlocal written
            async with limit:
                try:
                    if await self.sync_one(name, hint=fresh.get(name)):
                        written += 1
                except errors.LocalcacheError as exc:
                    _log.warning("localmodelnode_sync_failed", node=name, error=str(exc))
                    failures.append(exc)

        async with asyncio.TaskGroup() as tg:
            for name in todo:
                tg.create_task(one(name), name=f"sync-localmodelnode-{name}")
        if failures:
            raise failures[0]
        return written

    def forget_gone(self, snap: placement.Snapshot) -> list[str]:
        """Drop the state kept for nodes that are not in `snap` (deleted Nodes), unless a write
        to one is in progress; returns the names forgotten."""
        gone = [
            name
            for name in self._locks.keys() | self._written.keys()
            if name not in snap.nodes and not (name in self._locks and self._locks[name].locked())
        ]
        for name in gone:
            self._locks.pop(name, None)
            self._written.forget(name)
        if gone:
            _log.debug("localmodelnode_state_forgotten", nodes=sorted(gone))
        return sorted(gone)

    def tracked(self) -> frozenset[str]:
        """Names of the nodes this writer keeps state for (introspection for tests)."""
        return frozenset(self._locks.keys() | self._written.keys())

    async def sync_one(self, name: str, *, hint: Obj | None = None) -> bool:
        """Make node `name`'s LocalModelNode match the stores' desired state now. `hint` is
        a first guess of the current object (e.g. from a LIST)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._in_flight.add(done)
        try:
            return await self._sync_one(name, hint)
        finally:
            self._in_flight.discard(done)
            done.set_result(None)

    async def _sync_one(self, name: str, hint: Obj | None) -> bool:
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            fetched, guess = hint is not None, hint
            for _ in range(MAX_ATTEMPTS):
                snap = self._snapshot()
                node = snap.nodes.get(name)
                if node is None:
                    return False
                current = guess if fetched else self.current(name)
                try:
                    return await self._write(name, node, current, snap.desired_entries(name))
                except errors.Conflict as exc:
                    if current is None and not exc.already_exists:
                        raise
                    fetched, guess = True, await self._get(name)
                except errors.NotFound:
                    fetched, guess = True, None
            raise errors.Conflict(
                409, f"LocalModelNode {name}: still conflicting after {MAX_ATTEMPTS} tries"
            )

    async def _write(
        self, name: str, node: Obj, current: Obj | None, desired: entries.Desired
    ) -> bool:
        res = state.LOCAL_MODEL_NODES
        if current is None:
            if not len(desired):
                return False
            created = await self._api.create(res, new_object(node, desired))
            self._written.wrote(name, replaced="", value=created)
            _log.info("localmodelnode_created", node=name, entries=len(desired))
            return True
        patch = patch_for(current, node, desired, self.signatures)
        if patch is None:
            return False
        updated = await self._api.patch(res, name, patch)
        self._written.wrote(name, replaced=_rv(current), value=updated)
        _log.info("localmodelnode_updated", node=name, entries=len(desired))
        return True

    async def drop_entry(self, lmn: Obj, key: entries.EntryKey) -> None:
        """Remove one entry from a LocalModelNode whose Node is not known (compare-and-swap,
        retried on Conflict); other entries and ownerReferences stay as they are."""
        name = state.name_of(lmn)
        current: Obj | None = lmn
        for _ in range(MAX_ATTEMPTS):
            if current is None:
                return
            keep = {
                entries.entry_key_of(e): e
                for e in (current.get("spec") or {}).get("localModels") or []
                if entries.entry_key_of(e) != key
            }
            patch = patch_for(current, None, entries.Desired.of(keep))
            if patch is None:
                return
            try:
                await self._api.patch(state.LOCAL_MODEL_NODES, name, patch)
                return
            except errors.Conflict:
                current = await self._get(name)
            except errors.NotFound:
                return
        raise errors.Conflict(409, f"LocalModelNode {name}: still conflicting")

    async def _get(self, name: str) -> Obj | None:
        try:
            return await self._api.get(state.LOCAL_MODEL_NODES, name)
        except errors.NotFound:
            return None


slim_node = indexes.slim_node
"""Nodes carry large statuses (images, addresses); we need labels and conditions. The
webhooks' node informer uses the same function, so one shared informer serves both."""
