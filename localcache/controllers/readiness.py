"""Serving pods wait for their copy: per-node readiness labels and Events on waiting pods.

Two controllers (both need the lease: they write):

- `nodereadiness`, keyed by Node name: keeps on each Node exactly the readiness labels
  `caching.readiness.desired_labels` gives for its LocalModelNode (a label per cache whose
  copy there is complete; none while `localModel.servingPodsWaitForCopy` is off). It writes a
  merge patch of `metadata.labels` touching only keys under `caching.readiness.PREFIX`, and
  only when they differ. Triggered by the Node (added, own labels changed), its
  LocalModelNode (spec or status changed, deleted) and, through `config_changed()`, a flip
  of the setting (every Node again). The labels are written by this trusted controller from
  the LocalModelNode's spec (the controller's placement) and status (the node's agent); an
  agent cannot add a label for a cache its node was not given.
- `waitingpods`, keyed by pod: a pod that the pod webhook (`webhooks.podwait`) gave a
  readiness requirement (its `WAITS_FOR_ANNOTATION`) and that the scheduler reports
  unschedulable gets a Warning Event `WaitingForModelCopy` naming each cache it waits for and
  the nodes still downloading it (with their state), then is looked at again every
  `WAITING_RECHECK_S` while it stays so, and whenever a LocalModelNode listing one of its caches
  changes. Events go through the shared recorder (deduplicated by
  message with a count bump, and its per-object token bucket), so a pod that waits long gets
  a handful of Events, not one per look. Only pods carrying
  `internal.serving.kserve.io/localmodel` are watched (a label-selected watch, slimmed to
  what is read here).

Not promised: a label appears the moment a copy completes (it follows the agent's status
write and this controller's queue); a pod already admitted keeps its requirement when the
setting is turned off (it then waits for labels that are gone: delete it).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

import structlog

from localcache.api import inferenceservice, modelnode
from localcache.caching import keys, readiness
from localcache.controllers import nodes, state
from localcache.controllers import status as cache_status
from localcache.runtime import clock as clock_mod
from localcache.runtime import (
    controller,
    errors,
    events,
    handlers,
    informer,
    kube,
    manager,
    metrics,
    predicates,
    reconcile,
    store,
    workqueue,
)
from localcache.runtime import factory as factory_mod
from localcache.runtime import keys as runtime_keys

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
WAITS_FOR_ANNOTATION: Final = readiness.WAITS_FOR_ANNOTATION
WAITING_REASON: Final = "WaitingForModelCopy"
WAITING_RECHECK_S: Final = 60.0
POD_SELECTOR: Final = inferenceservice.LOCAL_MODEL_LABEL


class NodePatcher(Protocol):
    """The one API call of `NodeLabels` (`runtime.kube.Kube` provides it)."""

    async def patch(self, res: kube.Resource, name: str, patch: kube.Patch) -> Obj: ...


def _labels(obj: Obj | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


class NodeLabels:
    """The `nodereadiness` reconciler (module docstring)."""

    def __init__(
        self,
        *,
        api: NodePatcher,
        nodes: store.Reader,
        local_model_nodes: store.Reader,
        enabled: Callable[[], bool],
    ) -> None:
        self._api = api
        self._nodes = nodes
        self._lmns = local_model_nodes
        self._enabled = enabled

    async def reconcile(self, key: runtime_keys.ObjectKey) -> reconcile.Result:
        node = self._nodes.get(key)
        if node is None:
            return reconcile.Result()
        desired = readiness.desired_labels(self._lmns.get(key), enabled=self._enabled())
        patch = readiness.label_patch(_labels(node), desired)
        if patch is None:
            return reconcile.Result()
        try:
            await self._api.patch(kube.NODES, key.name, patch)
        except errors.NotFound:
            return reconcile.Result()
        changes = patch["metadata"]["labels"]
        _log.info(
            "node_readiness_labels_updated",
            node=key.name,
            added=sorted(k for k, v in changes.items() if v is not None),
            removed=sorted(k for k, v in changes.items() if v is None),
        )
        return reconcile.Result()


def waits_for(pod: Obj) -> list[str]:
    """The status keys of the caches `pod` waits for (its `WAITS_FOR_ANNOTATION`)."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(WAITS_FOR_ANNOTATION)
    return [k for k in str(value or "").split(",") if k]


def is_unschedulable(pod: Obj) -> bool:
    """Pending, not bound, and the scheduler said Unschedulable."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending") or (pod.get("spec") or {}).get("nodeName"):
        return False
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


def describe_cache(status_key: str) -> str:
    namespace, name = keys.parse_status_key(status_key)
    if namespace:
        return f"LocalModelNamespaceCache {namespace}/{name}"
    return f"LocalModelCache {name}"


def waiting_message(status_key: str, lmns: list[Obj]) -> str:
    """The Event message for a pod waiting for `status_key`, given the LocalModelNodes
    listing that cache: the nodes still downloading it (with their state) and those done."""
    pending: list[str] = []
    complete: list[str] = []
    for lmn in sorted(lmns, key=state.name_of):
        phase = ((lmn.get("status") or {}).get("modelStatus") or {}).get(status_key)
        if phase == modelnode.ModelStatus.DOWNLOADED:
            complete.append(state.name_of(lmn))
        else:
            pending.append(f"{state.name_of(lmn)} ({phase or 'not reported yet'})")
    message = f"waiting for a complete copy of {describe_cache(status_key)}"
    if not lmns:
        return f"{message}: no node of its node groups holds it"
    message += f"; nodes still downloading: {', '.join(pending) or 'none'}"
    if complete:
        message += f"; complete on: {', '.join(complete)} (other constraints keep the pod off)"
    return message


BY_WAITS_FOR: Final = "readiness/waits-for"
POD_INDEXERS: Final = {BY_WAITS_FOR: waits_for}


def pods_waiting_for(pods: store.Reader, lmn: Obj) -> list[runtime_keys.ObjectKey]:
    """The waiting pods whose caches the LocalModelNode lists (its download state is what
    their Events report), through `BY_WAITS_FOR` (no scan of every pod per node event)."""
    found = {
        runtime_keys.ObjectKey.of(pod)
        for status_key in set(state.index_entries(lmn))
        for pod in pods.by_index(BY_WAITS_FOR, status_key)
        if is_unschedulable(pod)
    }
    return sorted(found, key=lambda k: (k.namespace, k.name))


class WaitingPods:
    """The `waitingpods` reconciler (module docstring)."""

    def __init__(
        self, *, pods: store.Reader, local_model_nodes: store.Reader, recorder: events.Recorder
    ) -> None:
        self._pods = pods
        self._lmns = local_model_nodes
        self._recorder = recorder

    async def reconcile(self, key: runtime_keys.ObjectKey) -> reconcile.Result:
        pod = self._pods.get(key)
        if pod is None or not is_unschedulable(pod):
            return reconcile.Result()
        caches = waits_for(pod)
        if not caches:
            return reconcile.Result()
        meta = pod.get("metadata") or {}
        involved = events.involved_object(
            api_version="v1",
            kind="Pod",
            name=key.name,
            uid=str(meta.get("uid") or ""),
            namespace=key.namespace,
        )
        for status_key in caches:
            message = waiting_message(status_key, self._lmns.by_index(state.BY_ENTRY, status_key))
            try:
                await self._recorder.record(
                    involved,
                    type="Warning",
                    reason=WAITING_REASON,
                    message=message,
                    spam_key=status_key,
                )
            except errors.LocalcacheError as exc:
                _log.warning("event_not_recorded", reason=WAITING_REASON, error=str(exc))
        return reconcile.Result(requeue_after=WAITING_RECHECK_S)


def slim_pod(obj: Obj) -> Obj:
    """What `waitingpods` reads of a pod: metadata, nodeName and the PodScheduled state."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    kept = ("name", "namespace", "uid", "resourceVersion")
    waits = (meta.get("annotations") or {}).get(WAITS_FOR_ANNOTATION)
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {
            **{k: meta[k] for k in kept if k in meta},
            **({"annotations": {WAITS_FOR_ANNOTATION: waits}} if waits is not None else {}),
        },
        "spec": {"nodeName": (obj.get("spec") or {}).get("nodeName")},
        "status": {
            "phase": status.get("phase"),
            "conditions": [
                c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"
            ],
        },
    }


def _own_labels(obj: Obj) -> dict[str, str]:
    return {k: v for k, v in _labels(obj).items() if readiness.is_own(k)}


def _lmn_changed(old: Obj, new: Obj) -> bool:
    return old.get("status") != new.get("status") or old.get("spec") != new.get("spec")


def _pod_changed(old: Obj, new: Obj) -> bool:
    return is_unschedulable(old) != is_unschedulable(new) or old.get("status") != new.get("status")


@dataclass
class ReadinessControllers:
    """What `setup` registered."""

    node_labels: controller.Controller
    nodes: informer.Informer
    enabled: Callable[[], bool]
    _last: bool | None = None

    def config_changed(self) -> None:
        """The configuration may have changed: when the setting flipped (or on the first
        call), every Node is looked at again (a Node whose labels already match is not
        written)."""
        now = self.enabled()
        if now == self._last:
            return
        self._last = now
        for key in list(self.nodes.reader().keys()):
            self.node_labels.queue.add(key)


def _controller(
    name: str, rec: reconcile.Reconciler, *, clock: clock_mod.Clock, registry: metrics.Metrics
) -> controller.Controller:
    queue = workqueue.WorkQueue(name, clock=clock, metrics=registry.workqueue(name))
    return controller.Controller(
        name, rec, queue, clock=clock, workers=1, metrics=registry.controller(name)
    )


def setup(
    mgr: manager.Manager,
    *,
    kube_api: kube.Kube,
    enabled: Callable[[], bool],
    metrics: metrics.Metrics,
    factory: factory_mod.InformerFactory,
    clock: clock_mod.Clock | None = None,
    instance: str | None = None,
) -> ReadinessControllers:
    """Register `nodereadiness` and `waitingpods` on `mgr`, reading through `factory`'s
    shared informers; `enabled` returns the live `localModel.servingPodsWaitForCopy`."""
    clk = clock or clock_mod.SystemClock()
    node_informer = factory.informer(kube.NODES, transform=nodes.slim_node)
    lmn_informer = factory.informer(
        state.LOCAL_MODEL_NODES, indexers=state.LOCAL_MODEL_NODE_INDEXERS
    )
    pod_informer = factory.informer(
        kube.PODS, label_selector=POD_SELECTOR, transform=slim_pod, indexers=POD_INDEXERS
    )
    labels = _controller(
        "nodereadiness",
        NodeLabels(
            api=kube_api,
            nodes=node_informer.reader(),
            local_model_nodes=lmn_informer.reader(),
            enabled=enabled,
        ),
        clock=clk,
        registry=metrics,
    )
    fn = predicates.funcs
    node_informer.add_handler(
        handlers.enqueue_self(
            labels.queue, fn(updated=lambda a, b: _own_labels(a) != _own_labels(b))
        )
    )
    lmn_informer.add_handler(handlers.enqueue_self(labels.queue, fn(updated=_lmn_changed)))
    recorder = events.Recorder(
        kube_api, component=cache_status.COMPONENT, instance=instance or socket.gethostname()
    )
    waiting = _controller(
        "waitingpods",
        WaitingPods(
            pods=pod_informer.reader(), local_model_nodes=lmn_informer.reader(), recorder=recorder
        ),
        clock=clk,
        registry=metrics,
    )
    pods = pod_informer.reader()
    lmn_informer.add_handler(
        handlers.enqueue_mapped(
            waiting.queue, lambda lmn: pods_waiting_for(pods, lmn), fn(updated=_lmn_changed)
        )
    )
    pod_informer.add_handler(
        handlers.enqueue_self(
            waiting.queue,
            fn(added=is_unschedulable, updated=_pod_changed, deleted=lambda _: False),
        )
    )
    mgr.add_controller(labels)
    mgr.add_controller(waiting)
    return ReadinessControllers(node_labels=labels, nodes=node_informer, enabled=enabled)
