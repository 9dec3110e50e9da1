"""Which container downloads a model: the template every download Job's (and every import
Job's) download container starts from. Pure, no I/O.

- `select_container(uri, storage_containers, storage_initializer)` is the first enabled
  ClusterStorageContainer, by name, with `workloadType: localModelDownloadJob` that supports
  `uri` (a deep copy of its container, named `CONTAINER_NAME` unless it names itself, with
  `storageInitializer`'s resources when it sets none), else a container of
  `storageInitializer`'s image and resources.
- A ClusterStorageContainer whose `supportedUriFormats` regex does not compile raises
  `ContainerError` naming it; callers report it and create no Job.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Final

from localcache.api import storage
from localcache.caching import config

CONTAINER_NAME: Final = "kserve-localmodel-download"


class ContainerError(Exception):
    """No container can be chosen (e.g. a ClusterStorageContainer with a bad regex)."""


def select_container(
    uri: str,
    storage_containers: Sequence[storage.ClusterStorageContainer],
    storage_initializer: config.StorageInitializerConfig,
) -> dict[str, Any]:
    """The download container template for `uri` (module docstring)."""
    for csc in sorted(storage_containers, key=lambda c: c.name):
        if csc.is_disabled or csc.workload_type != storage.WORKLOAD_LOCAL_MODEL_DOWNLOAD_JOB:
            continue
        try:
            supported = csc.supports_uri(uri)
        except ValueError as exc:
            raise ContainerError(str(exc)) from exc
        if supported:
            container = copy.deepcopy(csc.spec.container)
            container.setdefault("name", CONTAINER_NAME)
            if not container.get("resources"):
                container["resources"] = storage_initializer.resources()
            return container
    return {
        "name": CONTAINER_NAME,
        "image": storage_initializer.image,
        "resources": storage_initializer.resources(),
    }
