"""Deleting what no entry wants on each of the agent's models roots, by the keep rule.

`RootCleaner.clean` runs once per reconcile pass, after every unit was evaluated: on each
root it applies `roots.retention` (nothing on a root that no node group of the cluster
declares any more; never a folder whose entry is served on another root), deletes the rest
with `ModelDisk.delete_unreferenced` (with the stale staging folders), posts a Warning Event
per new deletion failure, and reports the folders it keeps: a log line
(`model_folders_kept`) and one `ModelFoldersKept` Warning Event per root each time the set
of kept folders changes (in this process: a restarted agent reports them once more).
Operators delete kept folders by hand (README, "Node group paths").

`RootCleaner.check_layout` runs first in every pass, per root: `ModelDisk.ensure_layout`,
a repair reported as a Warning Event each time, a refusal as one Event per distinct problem.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import pydantic
import structlog

from localcache.agent import plan, report
from localcache.agent.disk import folders as folders_mod
from localcache.agent.disk import layout, roots
from localcache.api import modelnode, nodegroup
from localcache.runtime import errors, onchange, store

log = structlog.get_logger(__name__)


class RootCleaner:
    """Cleans the roots of `disks`, reading node groups from `node_groups`."""

    def __init__(
        self, *, disks: roots.Disks, node_groups: store.Reader, reporter: report.Reporter
    ) -> None:
        self._disks = disks
        self._groups = node_groups
        self._report = reporter
        self._kept = onchange.OnChange()  # per root: the folders last reported as kept
        self._layout_warned = onchange.OnChange()  # per models root

    async def check_layout(
        self, node: modelnode.LocalModelNode | None, disk: folders_mod.ModelDisk
    ) -> None:
        """`disk.ensure_layout`, reported: a repair as a Warning Event each time, a refusal
        as one Warning Event per distinct problem, then raised (retried with backoff)."""
        where = str(disk.root)
        try:
            repaired = await asyncio.to_thread(disk.ensure_layout)
        except layout.DiskError as exc:
            log.error("models_root_unsafe", root=where, error=str(exc))
            if node is not None and self._layout_warned.changed(where, str(exc)):
                await self._report.event(node, "Warning", "ModelsRootUnsafe", str(exc))
            raise errors.LocalcacheError(f"models root {where}: {exc}") from exc
        self._layout_warned.forget(where)
        for message in repaired:
            log.warning("models_root_repaired", root=where, repair=message)
            if node is not None:
                await self._report.event(node, "Warning", "ModelsRootRepaired", message)

    async def clean(
        self,
        node: modelnode.LocalModelNode,
        *,
        anywhere: Collection[str],
        served: Mapping[str, Collection[str]],
        live_jobs: Collection[str],
    ) -> None:
        """`anywhere`: storage keys of all the node's entries; `served`: per root host path,
        the keys served there; `live_jobs`: download Jobs whose staging folders stay."""
        declared = declared_paths(self._groups.list())
        for disk in self._disks.all:
            path = roots.served_path(disk)
            folders = await asyncio.to_thread(disk.list_model_folders)
            keep = roots.retention(
                path=path,
                folders=folders,
                here=served.get(path, ()),
                anywhere=anywhere,
                declared=declared,
            )
            deleted = await asyncio.to_thread(
                disk.delete_unreferenced, keep.referenced, live_jobs=live_jobs
            )
            if deleted:
                log.info("model_folders_deleted", root=path, storage_keys=deleted)
            for failure in disk.take_new_deletion_failures():
                await self._report.event(node, "Warning", "ModelDeletionFailed", failure.message)
            await self._report_kept(node, path, keep.kept)

    async def _report_kept(
        self, node: modelnode.LocalModelNode, path: str, kept: frozenset[str]
    ) -> None:
        if not self._kept.changed(path, kept) or not kept:
            return
        log.warning("model_folders_kept", root=path, storage_keys=sorted(kept))
        message = plan.clip(
            f"{len(kept)} model folder(s) on {path} kept: no model of this node is served "
            "from there any more (a node group's PV path changed, or the group moved). "
            "localcache does not delete them; when no longer needed, delete "
            f"{path}/models/<key> and {path}/.manifests/<key>.json on the node by hand "
            f"(README, Node group paths). Keys: {', '.join(sorted(kept))}"
        )
        await self._report.event(node, "Warning", "ModelFoldersKept", message)


def declared_paths(groups: Iterable[dict[str, Any]]) -> set[str]:
    """The normalised PV paths of node group objects; a group that does not validate
    declares nothing (which only ever keeps more)."""
    paths = set()
    for obj in groups:
        try:
            path = nodegroup.LocalModelNodeGroup.model_validate(obj).spec.local_path()
        except pydantic.ValidationError:
            continue
        if path:
            paths.add(roots.normalise(path))
    return paths
