"""The `inferenceservice-config` in force, read from an informer cache (spec §5).

`LiveConfig(reader, key, initial=...)` re-parses the ConfigMap only when its resourceVersion
changed (a missing ConfigMap is KServe's defaults). When a version is invalid the last good
configuration stays in force; before any good one, `initial` is (KServe's defaults for the
controller and webhooks, None for the node agent, which waits). Each bad version is logged
once (`config_invalid`) and reported once to the caller through `Loaded.new_error`, so it
can surface it further (the agent posts an Event).

With `under=Under(reader, key)` (profile with-kserve: `--kserve-config`), KServe's ConfigMap
is read too, never written, and localcache's own ConfigMap is laid over it section by
section, key by key: localcache's keys win, KServe's fill in the rest (storageInitializer,
credentials, ...). A change of either re-parses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

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


@dataclass(frozen=True)
class Under:
    """KServe's ConfigMap, read only, under localcache's own: the own ConfigMap's keys win
    (`config.layer_data`)."""

    reader: store.Reader
    key: keys.ObjectKey


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "absent")


class LiveConfig(Generic[Initial]):
    """The configuration named `key` in `reader` (see the module docstring). Calling the
    object returns the configuration in force."""

    def __init__(
        self,
        reader: store.Reader,
        key: keys.ObjectKey,
        *,
        initial: Initial,
        under: Under | None = None,
    ) -> None:
        self._reader = reader
        self._key = key
        self._under = under
        self._version: str | None = None
        self._config: config_mod.InferenceServiceConfig | Initial = initial

    def _data(self) -> tuple[str, Callable[[], Mapping[str, Any]]]:
        """The version of what is read, and how to get its (layered) data."""
        obj = self._reader.get(self._key) or {}
        version = _version(obj)
        if self._under is None:
            return version, lambda: obj.get("data") or {}
        under = self._under.reader.get(self._under.key) or {}
        names = (str(self._under.key), str(self._key))
        return f"{_version(under)}+{version}", lambda: config_mod.layer_data(
            under.get("data") or {}, obj.get("data") or {}, names=names
        )

    def _names(self) -> dict[str, str]:
        names = {"configmap": str(self._key)}
        if self._under is not None:
            names["under"] = str(self._under.key)
        return names

    def load(self) -> Loaded[Initial]:
        version, data = self._data()
        if version == self._version:
            return Loaded(self._config)
        self._version = version
        try:
            self._config = config_mod.parse_config(data())
        except config_mod.ConfigError as exc:
            kept = self._config is not None
            log.error("config_invalid", **self._names(), error=str(exc), keeps_last_good=kept)
            return Loaded(self._config, new_error=exc)
        log.info("config_loaded", **self._names(), version=version)
        return Loaded(self._config)

    def __call__(self) -> config_mod.InferenceServiceConfig | Initial:
        return self.load().config
