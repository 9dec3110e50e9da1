"""The `inferenceservice-config` in force, read from an informer cache (spec §5).

`LiveConfig(reader, key, initial=...)` re-parses the ConfigMap only when its resourceVersion
changed (a missing ConfigMap is KServe's defaults). When a version is invalid the last good
configuration stays in force; before any good one, `initial` is (KServe's defaults for the
controller and webhooks, None for the node agent, which waits). Each bad version is logged
once (`config_invalid`) and reported once to the caller through `Loaded.new_error`, so it
can surface it further (the agent posts an Event).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog

from localcache.caching import config as config_mod
from localcache.runtime import keys, store

log = structlog.get_logger(__name__)

Initial = TypeVar("Initial", config_mod.InferenceServiceConfig, None)


@dataclass(frozen=True, slots=True)
class Loaded(Generic[Initial]):
    """The configuration in force, and the error of a bad version first seen by this load."""

    config: config_mod.InferenceServiceConfig | Initial
    new_error: config_mod.ConfigError | None = None


class LiveConfig(Generic[Initial]):
    """The configuration named `key` in `reader` (see the module docstring). Calling the
    object returns the configuration in force."""

    def __init__(self, reader: store.Reader, key: keys.ObjectKey, *, initial: Initial) -> None:
        self._reader = reader
        self._key = key
        self._version: str | None = None
        self._config: config_mod.InferenceServiceConfig | Initial = initial

    def load(self) -> Loaded[Initial]:
        obj = self._reader.get(self._key) or {}
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "absent")
        if version == self._version:
            return Loaded(self._config)
        self._version = version
        try:
            self._config = config_mod.parse_config(obj.get("data") or {})
        except config_mod.ConfigError as exc:
            kept = self._config is not None
            log.error(
                "config_invalid", configmap=str(self._key), error=str(exc), keeps_last_good=kept
            )
            return Loaded(self._config, new_error=exc)
        log.info("config_loaded", configmap=str(self._key), version=version)
        return Loaded(self._config)

    def __call__(self) -> config_mod.InferenceServiceConfig | Initial:
        return self.load().config
