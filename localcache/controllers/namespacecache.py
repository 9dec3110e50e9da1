"""The LocalModelNamespaceCache reconciler: the shared implementation in `reconciler.py`,
parameterised by the namespace scope (see `scope.py` for what differs). Its download PVC
lives in the cache's own namespace (spec §3), so nothing of it is created in jobNamespace."""

from __future__ import annotations

from typing import Final

from localcache.api import groupversion, modelcache
from localcache.controllers import scope

SCOPE: Final = scope.Scope(
    kind=groupversion.LOCAL_MODEL_NAMESPACE_CACHE,
    finalizer=modelcache.NAMESPACE_CACHE_FINALIZER,
    model=modelcache.LocalModelNamespaceCache,
)
