"""The agent DaemonSet follows the node groups' tolerations, so the agent runs on tainted nodes.

`setup(manager, ...)` registers the controller `agent-tolerations`, one key: localcache's own
agent DaemonSet (`--agent-daemonset` in the controller's namespace; never found by label).
Its reconcile reads the DaemonSet and every LocalModelNodeGroup from informers and, when
they differ from `caching.agenttolerations.plan` (installer's tolerations kept, the groups'
added, the ones no group has any more removed; the rules and edge cases are there), writes
one JSON merge patch of just `spec.template.spec.tolerations` and the record annotation, with
the read `resourceVersion` as precondition (a conflict raises: retried with backoff).

    event source         passes when                                    enqueues
    the DaemonSet        added; tolerations or record annotation        the DaemonSet
                         changed (an installer re-applied, a hand edit)
    LocalModelNodeGroup  added, deleted, spec.tolerations changed       the DaemonSet

A toleration a group asks for and does not get (invalid, over a bound) is logged
(`agent_toleration_rejected`, with group and key) and recorded as a Warning Event
`AgentTolerationRejected` on the group, once per group version. A missing DaemonSet (a local
`run`, another install's name) is no error: nothing is written until it appears.

Not promised: the agent pods are updated by the DaemonSet's own rolling update (every
change of the list restarts each agent once, `maxUnavailable` at a time).
"""

from __future__ import annotations

from typing import Any, Final

import structlog

from localcache.caching import agenttolerations as rules
from localcache.controllers import state
from localcache.runtime import clock as clock_mod
from localcache.runtime import (
    controller,
    errors,
    events,
    handlers,
    keys,
    manager,
    metrics,
    onchange,
    predicates,
    reconcile,
    store,
    workqueue,
)
from localcache.runtime import factory as factory_mod
from localcache.runtime import kube as kube_api

Obj = dict[str, Any]
NAME: Final = "agent-tolerations"
COMPONENT: Final = "localcache-controller"
REJECTED_REASON: Final = "AgentTolerationRejected"
_REPORTED_LIMIT: Final = 4096

_log = structlog.get_logger(__name__)


def _template_tolerations(obj: Obj) -> list[Obj] | None:
    spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    value = spec.get("tolerations")
    return value if isinstance(value, list) else None


def _record(obj: Obj) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(rules.RECORD_ANNOTATION)
    return value if isinstance(value, str) else None


def slim_daemonset(obj: Obj) -> Obj:
    """What the reconcile reads of the DaemonSet: identity, the record, the tolerations."""
    meta = obj.get("metadata") or {}
    slim_meta = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    record = _record(obj)
    if record is not None:
        slim_meta["annotations"] = {rules.RECORD_ANNOTATION: record}
    return {
        "metadata": slim_meta,
        "spec": {"template": {"spec": {"tolerations": _template_tolerations(obj)}}},
    }


def _group_tolerations(group: Obj) -> Any:
    return (group.get("spec") or {}).get("tolerations")


class AgentTolerationsReconciler:
    """Keeps the one agent DaemonSet's tolerations (module docstring)."""

    def __init__(
        self,
        *,
        api: state.Api,
        daemonsets: store.Reader,
        groups: store.Reader,
        recorder: events.Recorder | None = None,
    ) -> None:
        self._api = api
        self._daemonsets = daemonsets
        self._groups = groups
        self._recorder = recorder
        self._reported = onchange.OnChange(max_keys=_REPORTED_LIMIT)

    async def reconcile(self, key: keys.ObjectKey) -> reconcile.Result:
        ds = self._daemonsets.get(key)
        if ds is None:
            _log.debug("agent_daemonset_absent", daemonset=str(key))
            return reconcile.Result()
        groups = list(self._groups.list())
        named = [(str((g.get("metadata") or {}).get("name") or ""), g) for g in groups]
        template, record = _template_tolerations(ds), _record(ds)
        want = rules.plan(
            live=template,
            record=record,
            groups=[(name, _group_tolerations(g)) for name, g in named],
        )
        await self._report(want.rejected, dict(named))
        live = template or []
        if want.tolerations == live and want.record == (record or rules.record_text([])):
            return reconcile.Result()
        meta = ds.get("metadata") or {}
        body = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {rules.RECORD_ANNOTATION: want.record},
            },
            "spec": {"template": {"spec": {"tolerations": want.tolerations or None}}},
        }
        await self._api.patch(
            kube_api.DAEMON_SETS, key.name, body, namespace=key.namespace, patch_type="merge"
        )
        before = {rules.identity(t) for t in live}
        after = {rules.identity(t) for t in want.tolerations}
        _log.info(
            "agent_tolerations_synced",
            daemonset=str(key),
            added=[rules.canonical(t) for t in want.tolerations if rules.identity(t) not in before],
            removed=[rules.canonical(t) for t in live if rules.identity(t) not in after],
            from_groups=len(want.added),
        )
        return reconcile.Result()

    async def _report(self, rejected: tuple[rules.Rejected, ...], groups: dict[str, Obj]) -> None:
        for item in rejected:
            meta = groups.get(item.group, {}).get("metadata") or {}
            version = str(meta.get("resourceVersion") or "")
            if not self._reported.changed((item.group, item.key, item.reason), version):
                continue
            _log.warning(
                "agent_toleration_rejected", group=item.group, key=item.key, reason=item.reason
            )
            if self._recorder is None:
                continue
            involved = events.involved_object(
                api_version=state.LOCAL_MODEL_NODE_GROUPS.api_version,
                kind=state.LOCAL_MODEL_NODE_GROUPS.kind,
                name=item.group,
                uid=str(meta.get("uid") or ""),
                resource_version=meta.get("resourceVersion"),
            )
            message = (
                f"toleration with key {item.key!r} is not added to the localcache agent: "
                f"{item.reason}"
            )
            try:
                await self._recorder.record(
                    involved, type="Warning", reason=REJECTED_REASON, message=message
                )
            except errors.LocalcacheError as exc:
                _log.warning("event_not_recorded", reason=REJECTED_REASON, error=str(exc))


def _tolerations_changed(old: Obj, new: Obj) -> bool:
    return bool(_group_tolerations(old) != _group_tolerations(new))


def _daemonset_changed(old: Obj, new: Obj) -> bool:
    return (_template_tolerations(old), _record(old)) != (_template_tolerations(new), _record(new))


def setup(
    mgr: manager.Manager,
    *,
    kube: kube_api.Kube,
    factory: factory_mod.InformerFactory,
    daemonset: keys.ObjectKey,
    registry: metrics.Metrics,
    clock: clock_mod.Clock | None = None,
    instance: str = "",
) -> controller.Controller:
    """Register the controller for the DaemonSet `daemonset` (call before `mgr.run()`)."""
    clk = clock or clock_mod.SystemClock()
    daemonsets = factory.informer(
        kube_api.DAEMON_SETS,
        namespace=daemonset.namespace,
        field_selector=f"metadata.name={daemonset.name}",
        transform=slim_daemonset,
    )
    groups = factory.informer(state.LOCAL_MODEL_NODE_GROUPS)
    rec = AgentTolerationsReconciler(
        api=kube,
        daemonsets=daemonsets.reader(),
        groups=groups.reader(),
        recorder=events.Recorder(kube, component=COMPONENT, instance=instance),
    )
    queue = workqueue.WorkQueue(NAME, clock=clk, metrics=registry.workqueue(NAME))
    ctl = controller.Controller(
        NAME, rec, queue, clock=clk, workers=1, metrics=registry.controller(NAME)
    )

    def the_daemonset(_obj: Obj) -> list[keys.ObjectKey]:
        return [daemonset]

    fn = predicates.funcs
    daemonsets.add_handler(
        handlers.enqueue_mapped(queue, the_daemonset, fn(updated=_daemonset_changed))
    )
    groups.add_handler(
        handlers.enqueue_mapped(queue, the_daemonset, fn(updated=_tolerations_changed))
    )
    return mgr.add_controller(ctl)
