"""Whether a pod may mount a localcache volume, and what it then sees. Pure: no I/O.

A localcache PV names, in its `csi.volumeAttributes` (written by the controller; tenants
cannot create or edit PVs), the role of the volume, the cache's status key, its storage key and
the node group's models root. The kubelet adds the pod's namespace, name and uid
(`podInfoOnMount`). The answer is decided from those and this node's LocalModelNode, read at
mount time:

- a **serving** volume shows `models/<storage key>` only, read-only, and only when this node's
  entry for that cache (its status key) holds that storage key and is `ModelDownloaded`: the
  agent reports an entry downloaded only after that cache's own download or proof of access,
  so a namespace that proved nothing gets nothing. When the entry's scope downloaded content
  that differs from the folder in place, its status names its own folder variant
  (`modelProgress.folder`), which is then shown there instead. A namespace cache's volume is
  mounted only by pods of its namespace;
- a **download** volume shows `.staging/<storage key>-<job>` only, read-write, to a pod of a
  download Job the agent recorded on the node before creating it (`.jobs/<job>.json` on the
  models root, which no pod reaches: namespace, cache, storage key): the Job controller names
  its pods `<job>-<5 characters>`, and a pod of that name in another namespace gets nothing;
- anything else is refused, with a message the pod's Events show.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Final, Literal

from localcache.agent.disk import layout
from localcache.caching import keys

ATTRIBUTE_PREFIX: Final = "localcache.kserve.io/"
ROLE: Final = ATTRIBUTE_PREFIX + "role"
CACHE: Final = ATTRIBUTE_PREFIX + "cache"
STORAGE_KEY: Final = ATTRIBUTE_PREFIX + "storage-key"
ROOT: Final = ATTRIBUTE_PREFIX + "root"
POD_NAMESPACE: Final = "csi.storage.k8s.io/pod.namespace"
POD_NAME: Final = "csi.storage.k8s.io/pod.name"
POD_UID: Final = "csi.storage.k8s.io/pod.uid"
EPHEMERAL: Final = "csi.storage.k8s.io/ephemeral"
DOWNLOADED: Final = "ModelDownloaded"
_JOB_POD_SUFFIX = re.compile(r"-[a-z0-9]{5}")
_JOB_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")
MAX_ATTRIBUTE = 4096
"""Longest attribute value looked at; PV attributes are ours, pod info the kubelet's."""

Role = Literal["serving", "download"]


class Refused(Exception):
    """The pod may not mount the volume; the message says why (it reaches the pod's Events)."""


@dataclass(frozen=True, slots=True)
class Volume:
    """What a localcache PV says about itself (its `volumeAttributes`)."""

    role: Role
    cache: str
    storage_key: str
    root: str

    @classmethod
    def of(cls, attributes: Mapping[str, str]) -> Volume:
        value = _attribute(attributes, ROLE)
        role: Role
        if value == "serving":
            role = "serving"
        elif value == "download":
            role = "download"
        else:
            raise Refused(f"not a localcache volume: attribute {ROLE} is {value!r}")
        storage_key = _attribute(attributes, STORAGE_KEY)
        if not layout.is_storage_key(storage_key):
            raise Refused(f"attribute {STORAGE_KEY} is not a storage key: {storage_key!r}")
        root = _attribute(attributes, ROOT)
        if not PurePosixPath(root).is_absolute():
            raise Refused(f"attribute {ROOT} is not an absolute path: {root!r}")
        return cls(role, _attribute(attributes, CACHE), storage_key, posixpath.normpath(root))


@dataclass(frozen=True, slots=True)
class Pod:
    """The pod the kubelet mounts for (`podInfoOnMount`)."""

    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, context: Mapping[str, str]) -> Pod:
        if context.get(EPHEMERAL, "false") == "true":
            raise Refused("localcache volumes are not inline ephemeral volumes")
        return cls(
            _attribute(context, POD_NAMESPACE),
            _attribute(context, POD_NAME),
            _attribute(context, POD_UID),
        )


@dataclass(frozen=True, slots=True)
class Grant:
    """What the pod sees: the folder `source` of the models root, at `subpath` in its volume
    (the same place unless the entry is served from its scope's own folder variant)."""

    subpath: str
    writable: bool
    source: str = ""

    @property
    def folder(self) -> str:
        return self.source or self.subpath


def decide(
    volume: Volume,
    pod: Pod,
    *,
    node: Mapping[str, Any],
    node_name: str,
    job_record: Mapping[str, Any] | None = None,
    variants: Collection[str] = (),
) -> Grant:
    """The pod's view of `volume`, or `Refused` (module doc): `node` is this node's
    LocalModelNode as JSON, `job_record` the agent's record of the Job the pod's name
    names (`agent.disk.layout.JOBS_DIR`), `variants` the folder variants of the volume's
    storage key on its root."""
    if volume.role == "serving":
        return _serving(volume, pod, node, node_name, variants)
    return _download(volume, pod, job_record, node_name)


def _serving(
    volume: Volume,
    pod: Pod,
    node: Mapping[str, Any],
    node_name: str,
    variants: Collection[str],
) -> Grant:
    namespace, _name = keys.parse_status_key(volume.cache)
    if namespace is not None and namespace != pod.namespace:
        raise Refused(
            f"pod {pod.namespace}/{pod.name} may not mount LocalModelNamespaceCache "
            f"{volume.cache}: only pods of namespace {namespace} may"
        )
    entry = _entry(node, volume.cache)
    if entry is None:
        raise Refused(f"cache {volume.cache} has no entry on node {node_name}")
    entry_key = keys.storage_key(str(entry.get("sourceModelUri") or ""))
    if entry_key != volume.storage_key:
        raise Refused(
            f"cache {volume.cache} on node {node_name} holds storage key {entry_key}, "
            f"not the volume's {volume.storage_key}"
        )
    status = (_mapping(_mapping(node.get("status")).get("modelStatus"))).get(volume.cache)
    if status != DOWNLOADED:
        raise Refused(
            f"cache {volume.cache} is not downloaded on node {node_name} for this cache "
            f"(status {status or 'none'}); the pod's volume is mounted once it is"
        )
    status_progress = _mapping(node.get("status")).get("modelProgress")
    if variants and not isinstance(status_progress, Mapping):
        # KServe's CRD schema drops modelProgress, which says which folder serves the entry
        raise Refused(
            f"node {node_name} holds more than one copy of cache {volume.cache}'s model and "
            "its LocalModelNode status does not say which one is this cache's: install "
            "localcache's CRDs (README, KServe's CRD schema)"
        )
    folder = _mapping(_mapping(status_progress).get(volume.cache)).get("folder")
    source = ""
    if folder:
        if layout.key_of_folder(str(folder)) != volume.storage_key:
            raise Refused(f"cache {volume.cache} on node {node_name} names folder {folder!r}")
        source = f"{layout.MODELS_DIR}/{folder}"
    return Grant(layout.model_subpath(volume.storage_key), writable=False, source=source)


def job_of_pod(pod: Pod) -> str | None:
    """The Job a pod's name says it belongs to (`<job>-<5 characters>`), else None."""
    job, suffix = pod.name[:-6], pod.name[-6:]
    if not _JOB_POD_SUFFIX.fullmatch(suffix) or not _JOB_NAME.fullmatch(job):
        return None
    return job


def _download(volume: Volume, pod: Pod, record: Mapping[str, Any] | None, node_name: str) -> Grant:
    job = job_of_pod(pod)
    if (
        job is not None
        and record is not None
        and record.get("namespace") == pod.namespace
        and record.get("storageKey") == volume.storage_key
        and record.get("statusKey") == volume.cache
    ):
        return Grant(layout.staging_subpath(volume.storage_key, job), writable=True)
    raise Refused(
        f"pod {pod.namespace}/{pod.name} is not the pod of a download Job that node "
        f"{node_name}'s agent created for cache {volume.cache}"
    )


def _entry(node: Mapping[str, Any], status_key: str) -> Mapping[str, Any] | None:
    for entry in _mapping(node.get("spec")).get("localModels") or []:
        if not isinstance(entry, Mapping):
            continue
        try:
            key = keys.status_key(str(entry.get("modelName") or ""), entry.get("namespace") or None)
        except ValueError:
            continue
        if key == status_key:
            return entry
    return None


def _attribute(attributes: Mapping[str, str], name: str) -> str:
    value = attributes.get(name)
    if not value:
        raise Refused(f"volume attribute {name} is missing")
    return str(value)[:MAX_ATTRIBUTE]


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
