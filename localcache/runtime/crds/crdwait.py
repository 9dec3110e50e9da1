"""Waiting, before the informers start, until the CustomResourceDefinitions they watch serve.

A process started before its CRDs (KServe's chart installs the four localmodel CRDs, and may
come after localcache) must not crash-loop on a cache sync that cannot happen: it waits,
probes answering (/healthz and /readyz pass: see `manager.Manager.add_prerequisite`), and goes
on the moment every CRD is Established and serves the version it reads
(`optional.crd_serves`).

Contract of `wait_served(api, wanted)`:
- polls `GET customresourcedefinitions/<name>` for the ones still missing, each call with
  `REQUEST_TIMEOUT_S`, sleeping `POLL_S` doubling to `POLL_MAX_S` between rounds (reset to
  `POLL_S` once something changed); a CRD the process may not `get` (403: RBAC without that
  CRD's name) is not waited for: `crd_check_forbidden` is logged and the informers go on as
  they would without this wait;
- logs `waiting_for_crds` (warning) with the missing names and `hint` on the first round that
  finds one missing and then every `LOG_EVERY_S`; `crds_served` (info) once all serve; an
  apiserver or transport error is logged (`crd_check_failed`) and retried the same way;
- returns only when every CRD serves; cancel it to give up (the Manager does, on stop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog

from localcache.runtime import errors
from localcache.runtime import kube as kube_mod
from localcache.runtime.crds import optional

_log = structlog.get_logger(__name__)

REQUEST_TIMEOUT_S = 10.0
POLL_S = 1.0
POLL_MAX_S = 10.0
LOG_EVERY_S = 60.0


async def _missing(api: kube_mod.Kube, wanted: Sequence[tuple[str, str]]) -> list[str]:
    missing = []
    for name, version in wanted:
        try:
            crd = await api.get(
                kube_mod.CUSTOM_RESOURCE_DEFINITIONS, name, request_timeout=REQUEST_TIMEOUT_S
            )
        except errors.NotFound:
            crd = None
        except errors.ApiError as exc:
            if exc.status != 403:
                raise
            # RBAC without `get` on this CRD: it cannot be checked; the informers will tell
            _log.warning("crd_check_forbidden", crd=name, error=str(exc))
            continue
        if not optional.crd_serves(crd, version):
            missing.append(name)
    return missing


async def wait_served(
    api: kube_mod.Kube,
    wanted: Sequence[tuple[str, str]],
    *,
    hint: str = "",
    poll: float = POLL_S,
    log_every: float = LOG_EVERY_S,
) -> None:
    """Return once every `(crd name, version)` in `wanted` is Established and served."""
    loop = asyncio.get_running_loop()
    delay = poll
    last_log: float | None = None
    previous: list[str] | None = None
    while True:
        try:
            missing = await _missing(api, wanted)
        except (errors.ApiError, errors.TransportError) as exc:
            _log.warning("crd_check_failed", error=str(exc))
            missing = previous if previous is not None else [name for name, _ in wanted]
        if not missing:
            if previous:
                _log.info("crds_served", crds=[name for name, _ in wanted])
            return
        now = loop.time()
        if last_log is None or now - last_log >= log_every:
            _log.warning("waiting_for_crds", missing=missing, hint=hint)
            last_log = now
        delay = poll if missing != previous else min(delay * 2, POLL_MAX_S)
        previous = missing
        await asyncio.sleep(delay)
