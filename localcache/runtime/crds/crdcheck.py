"""Say out loud when a served CRD lacks fields we write: the apiserver would prune them silently.

`setup(manager, ...)` watches each wanted CustomResourceDefinition by name (one informer per
name, `metadata.name=<name>`: RBAC may then limit get/list/watch to those names) and runs a
`CrdSchemaCheck` controller keyed by CRD name. It does not need the lease: every replica
checks at start-up and again on every change of a watched CRD (created, replaced by an
upgrade, deleted). Each reconcile compares the wanted CRD with the served one
(`schemadiff.compare`) and, when the finding changed since this process last reported it:

- logs one line: `crd_schema_degraded` (warning: `crd`, `missing_fields`, `missing_rules`,
  `fix` naming how to install the wanted CRDs) or `crd_schema_complete` (info), or
  `crd_schema_not_checked` (warning) while the CRD does not exist;
- sets the gauges `localcache_crd_schema_degraded{crd}` (1 when something is missing, else 0)
  and `localcache_crd_schema_missing_fields{crd}` (how many field paths are missing; both
  series are removed while the CRD does not exist);
- when degraded, records a Warning Event `CRDSchemaDegraded` about the CRD object itself
  (`kubectl describe crd <name>` lists it; cluster-scoped objects' Events live in
  `default`), through `runtime.events.Recorder` (component `localcache-controller`). The
  Event's name is derived from the CRD's uid and the finding, so replicas and restarts bump
  one Event's `count` and `lastTimestamp` instead of adding more. A failed
  Event write is retried with backoff (the reconcile raises; the log line is not repeated),
  except a 403, which is logged (`crd_schema_event_not_recorded`) and not retried. Once
  complete, a later degradation is evented again.

Not promised: that a reader sees the gauges before the first reconcile (the check runs once
informers synced), or an Event while the finding is unchanged for longer than the
apiserver's event TTL (1 h by default): the gauge and the start-up line remain.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

import structlog

from localcache.runtime import clock as clock_mod
from localcache.runtime import (
    controller,
    errors,
    events,
    factory,
    handlers,
    keys,
    kube,
    manager,
    metrics,
    onchange,
    reconcile,
    store,
    workqueue,
)
from localcache.runtime.crds import schemadiff

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]

CONTROLLER_NAME: Final = "crd-schema-check"
REASON: Final = "CRDSchemaDegraded"
EVENT_NAMESPACE: Final = "default"
DEGRADED_METRIC: Final = "localcache_crd_schema_degraded"
MISSING_METRIC: Final = "localcache_crd_schema_missing_fields"
MAX_MESSAGE: Final = 1024
COMPONENT: Final = "localcache-controller"


def event_message(finding: schemadiff.SchemaFinding, fix: str) -> str:
    """The Event's message: what is missing (cut to fit `MAX_MESSAGE`), then the fix."""
    parts: list[str] = []
    if finding.missing_fields:
        parts.append(
            "the served schema lacks these fields, which the apiserver drops on every write: "
            + ", ".join(finding.missing_fields)
        )
    if finding.missing_rules:
        parts.append("these validation rules are not enforced: " + "; ".join(finding.missing_rules))
    head = ". ".join(parts)
    tail = f". To keep them, {fix}"
    room = MAX_MESSAGE - len(tail)
    if len(head) > room:
        head = head[: room - 4].rstrip(", ;") + " ..."
    return head + tail


def event_name(crd: str, uid: str, finding: schemadiff.SchemaFinding) -> str:
    """`<crd>.<digest>`: one Event per CRD object and finding (see module docstring)."""
    return f"{crd}.{events.digest(uid, *finding.missing_fields, '', *finding.missing_rules)}"


class EventApi(events.Api, Protocol):
    """The API calls the check makes (`kube.Kube` provides them)."""


class CrdSchemaCheck:
    """The reconciler (module docstring): one key per wanted CRD, cluster-scoped."""

    def __init__(
        self,
        wanted: Mapping[str, Mapping[str, Any]],
        readers: Mapping[str, store.Reader],
        *,
        api: EventApi,
        registry: metrics.Metrics,
        fix: str,
        instance: str = "",
        now: Callable[[], str] = clock_mod.now_rfc3339,
    ) -> None:
        self._wanted = wanted
        self._readers = readers
        self._fix = fix
        self._events = events.Recorder(api, component=COMPONENT, instance=instance, now=now)
        self._degraded = registry.gauge(
            DEGRADED_METRIC,
            "1 when the served CRD lacks fields or rules localcache uses (they are pruned "
            "or not enforced), 0 when it has them all.",
            labels=("crd",),
        )
        self._missing = registry.gauge(
            MISSING_METRIC,
            "How many field paths localcache uses the served CRD does not declare.",
            labels=("crd",),
        )
        self._reported = onchange.OnChange()
        self._evented: dict[str, str] = {}

    async def reconcile(self, key: keys.ObjectKey) -> reconcile.Result:
        name = key.name
        wanted = self._wanted.get(name)
        if wanted is None:
            return reconcile.Result()
        served = self._readers[name].get(keys.ObjectKey("", name))
        finding = schemadiff.compare(wanted, served) if served is not None else None
        if self._reported.changed(name, finding):
            self._report(name, finding)
        if served is None or finding is None or not finding.degraded:
            self._evented.pop(name, None)  # degraded again later: a new Event, or a bump
            return reconcile.Result()
        uid = str((served.get("metadata") or {}).get("uid", ""))
        event = event_name(name, uid, finding)
        if self._evented.get(name) != event:
            await self._record(served, finding, event)
            self._evented[name] = event
        return reconcile.Result()

    def _report(self, name: str, finding: schemadiff.SchemaFinding | None) -> None:
        if finding is None:
            _log.warning("crd_schema_not_checked", crd=name, reason="the CRD does not exist")
            for gauge in (self._degraded, self._missing):
                with contextlib.suppress(KeyError):  # never set
                    gauge.remove(crd=name)
            return
        self._degraded.set(1 if finding.degraded else 0, crd=name)
        self._missing.set(len(finding.missing_fields), crd=name)
        if finding.degraded:
            _log.warning(
                "crd_schema_degraded",
                crd=name,
                missing_fields=list(finding.missing_fields),
                missing_rules=list(finding.missing_rules),
                fix=self._fix,
            )
        else:
            _log.info("crd_schema_complete", crd=name)

    async def _record(self, crd: Obj, finding: schemadiff.SchemaFinding, name: str) -> None:
        meta = crd.get("metadata") or {}
        involved = events.involved_object(
            api_version=crd.get("apiVersion", "apiextensions.k8s.io/v1"),
            kind="CustomResourceDefinition",
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            resource_version=meta.get("resourceVersion", ""),
        )
        try:
            await self._events.record(
                involved,
                type="Warning",
                reason=REASON,
                message=event_message(finding, self._fix),
                name=name,
                namespace=EVENT_NAMESPACE,
            )
        except errors.Forbidden as exc:
            # RBAC will not change by retrying: the log line and the gauge remain
            _log.warning("crd_schema_event_not_recorded", crd=meta.get("name"), error=str(exc))


def crd_field_selector(name: str) -> str:
    return f"metadata.name={name}"


def setup(
    mgr: manager.Manager,
    *,
    informers: factory.InformerFactory,
    api: EventApi,
    registry: metrics.Metrics,
    wanted: Sequence[Mapping[str, Any]],
    fix: str,
    instance: str = "",
    clock: clock_mod.Clock | None = None,
) -> tuple[CrdSchemaCheck, controller.Controller]:
    """Watch the `wanted` CRDs by name and run the check on every replica (module docstring).
    `fix` says how to install the wanted CRDs; it goes into the log line and the Event."""
    clk = clock or clock_mod.SystemClock()
    by_name = {str(crd["metadata"]["name"]): crd for crd in wanted}
    queue = workqueue.WorkQueue(
        CONTROLLER_NAME, clock=clk, metrics=registry.workqueue(CONTROLLER_NAME)
    )
    readers: dict[str, store.Reader] = {}
    for name in by_name:
        inf = informers.informer(
            kube.CUSTOM_RESOURCE_DEFINITIONS, field_selector=crd_field_selector(name)
        )
        inf.add_handler(handlers.enqueue_self(queue))
        readers[name] = inf.reader()
        # the first LIST of an absent CRD sends no event: ask once anyway
        queue.add(keys.ObjectKey("", name))
    check = CrdSchemaCheck(by_name, readers, api=api, registry=registry, fix=fix, instance=instance)
    ctl = controller.Controller(
        CONTROLLER_NAME,
        check,
        queue,
        clock=clk,
        metrics=registry.controller(CONTROLLER_NAME),
    )
    mgr.add_controller(ctl, needs_leader=False)
    return check, ctl
