"""Kubernetes API access: the only module that imports kubernetes_asyncio.

`Kube` speaks to the apiserver with plain dicts (Kubernetes JSON) for any resource described
by a `Resource` record (core, apps, batch, coordination, CRDs alike). kubernetes_asyncio is
used for configuration (kubeconfig, in-cluster, token refresh) and its TLS-configured aiohttp
session; its model classes are never used, so nothing is deserialised into generated models.
This module builds the client from a configuration; the verbs themselves (`get`, `list`,
`watch`, `create`, `replace`, `patch`, `delete`, ...) are `apiverbs.Verbs`, which `Kube`
inherits, over `transport.Transport`.

Contract:
- Every call has a client-side timeout (`request_timeout=` per call, else the client's).
- Failures raise the `errors` tree: a non-2xx answer maps its HTTP status onto an `ApiError`
  subclass carrying the Status reason and message (429 also carries `retry_after`); a refused,
  reset or broken connection is a `TransportError`; a passed deadline is an `ApiTimeout`.
- `watch()` yields raw events `{"type", "object"}` and turns an `ERROR` event into the mapped
  `ApiError` (so 410 arrives as `errors.Gone` whether it comes as a status or in the stream).
  A connection that delivers no bytes for `read_deadline` seconds raises `ApiTimeout`.
- List items get `apiVersion`/`kind` filled in when the server omits them.
- `requests` counts calls per verb, as data for tests and benchmarks; `instrument()` also
  reports every request to client-go's `rest_client_*` metrics.
- A configuration that cannot be used (a kubeconfig that is missing or does not parse, no
  current context, not in a pod) raises `errors.ConfigError` from the constructors.
Not promised: retries. Callers (reflector, lease, reconcilers) decide how to retry.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from localcache.runtime import apitypes, apiverbs, errors, transport

# The API's vocabulary lives in `apitypes`; callers find it here.
Obj = apitypes.Obj
Patch = apitypes.Patch
PatchType = apitypes.PatchType
Resource = apitypes.Resource
ObjList = apitypes.ObjList
WatchStream = transport.WatchStream
error_from_status = transport.error_from_status
NAMESPACES = apitypes.NAMESPACES
NODES = apitypes.NODES
PODS = apitypes.PODS
SECRETS = apitypes.SECRETS
SERVICE_ACCOUNTS = apitypes.SERVICE_ACCOUNTS
CONFIG_MAPS = apitypes.CONFIG_MAPS
EVENTS = apitypes.EVENTS
PERSISTENT_VOLUMES = apitypes.PERSISTENT_VOLUMES
PERSISTENT_VOLUME_CLAIMS = apitypes.PERSISTENT_VOLUME_CLAIMS
JOBS = apitypes.JOBS
DAEMON_SETS = apitypes.DAEMON_SETS
LEASES = apitypes.LEASES
MUTATING_WEBHOOK_CONFIGURATIONS = apitypes.MUTATING_WEBHOOK_CONFIGURATIONS
VALIDATING_WEBHOOK_CONFIGURATIONS = apitypes.VALIDATING_WEBHOOK_CONFIGURATIONS
CUSTOM_RESOURCE_DEFINITIONS = apitypes.CUSTOM_RESOURCE_DEFINITIONS
TOKEN_REVIEWS = apitypes.TOKEN_REVIEWS

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_READ_DEADLINE_S = apiverbs.DEFAULT_READ_DEADLINE_S


# What kubernetes_asyncio raises for a configuration it cannot use: its own exception, and
# whatever a kubeconfig of the wrong shape makes its parser raise (it reads YAML by key).
_CONFIG_ERRORS = (
    k8s_config.ConfigException,
    yaml.YAMLError,
    OSError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _current_kubeconfig() -> str:
    env = os.environ.get("KUBECONFIG", "")
    first = next((p for p in env.split(os.pathsep) if p), "")
    return first or str(Path.home() / ".kube" / "config")


class Kube(apiverbs.Verbs):
    """An API client for any resource; plain dicts in and out. Use as an async context
    manager or call `close()`. Construct with `from_kubeconfig`, `in_cluster` or `auto`; the
    verbs (get, list, watch, create, replace, patch, delete, ...) are `apiverbs.Verbs`'."""

    def __init__(self, configuration: Any, *, request_timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """Wrap a kubernetes_asyncio `Configuration`; must be called inside a running loop."""
        self._api = k8s_client.ApiClient(configuration)
        self._config = configuration
        self._http = transport.Transport(
            self._api.rest_client,
            configuration,
            default_headers=self._api.default_headers,
            request_timeout=request_timeout,
        )
        self.requests = self._http.requests
        """Requests sent, per verb (get, list, watch, create, update, patch, delete, raw)."""

    def instrument(self, metrics: transport.RequestMetrics) -> None:
        """Report every request from now on to `metrics` (`metrics.Metrics.rest_client()`)."""
        self._http.metrics = metrics

    # ---------------------------------------------------------------- constructors

    @classmethod
    async def from_kubeconfig(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        context: str | None = None,
        request_timeout: float = DEFAULT_TIMEOUT_S,
    ) -> Kube:
        """From a kubeconfig file; `None` means the current one ($KUBECONFIG, ~/.kube/config)."""
        file = str(path) if path is not None else _current_kubeconfig()
        # Checked first, as the loader would log a warning of its own. (One stat: the loader
        # reads the file without a thread too.)
        if not Path(file).is_file():  # noqa: ASYNC240
            what = "not a file" if Path(file).exists() else "no such file"  # noqa: ASYNC240
            raise errors.ConfigError(f"kubeconfig {file}: {what}")
        configuration = k8s_client.Configuration()
        try:
            await k8s_config.load_kube_config(
                config_file=file,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        except _CONFIG_ERRORS as exc:
            raise errors.ConfigError(f"kubeconfig {file} is unusable: {_first_line(exc)}") from exc
        return cls(configuration, request_timeout=request_timeout)

    @classmethod
    async def in_cluster(cls, *, request_timeout: float = DEFAULT_TIMEOUT_S) -> Kube:
        """From the pod's service account (the token is re-read as it rotates)."""
        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration, try_refresh_token=True
            )
        except _CONFIG_ERRORS as exc:
            raise errors.ConfigError(f"in-cluster configuration: {_first_line(exc)}") from exc
        return cls(configuration, request_timeout=request_timeout)

    @classmethod
    async def auto(cls, *, request_timeout: float = DEFAULT_TIMEOUT_S) -> Kube:
        """In-cluster when running in a pod, else the current kubeconfig."""
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
            return await cls.in_cluster(request_timeout=request_timeout)
        return await cls.from_kubeconfig(request_timeout=request_timeout)

    @property
    def server(self) -> str:
        return str(self._config.host)

    async def close(self) -> None:
        await self._api.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
