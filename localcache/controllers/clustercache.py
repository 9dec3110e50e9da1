"""The LocalModelCache (cluster-scoped) reconciler: the shared implementation in
`reconciler.py`, parameterised by the cluster scope (see `scope.py` for what differs)."""

from __future__ import annotations

from typing import Final

from localcache.api import groupversion, modelcache
from localcache.controllers import scope

SCOPE: Final = scope.Scope(
    kind=groupversion.LOCAL_MODEL_CACHE,
    finalizer=modelcache.FINALIZER,
    model=modelcache.LocalModelCache,
)
