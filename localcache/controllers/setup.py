"""Wiring of the cache controllers on a runtime Manager: informers, indexes, watches, mappings.

`setup(manager, kube=..., config=..., metrics=...)` takes one informer per resource read
(both cache kinds, LocalModelNodes, LocalModelNodeGroups, Nodes, PVs, PVCs and
InferenceServices, these unless a fixed `config` has `disableVolumeManagement` on) from an
`InformerFactory` (the process's shared one when given, so the webhooks and agents of the
same Manager reuse the same watches and caches) and registers three controllers:
`localmodelcache`, `localmodelnamespacecache` (the shared `CacheReconciler` with each
kind's Scope) and `localmodelnodegroup` (group usage). Each cache controller is fed by:

    event source          passes when                              enqueues
    its own kind          added, deleted, generation/finalizers/   the cache
                          deletionTimestamp changed
    Node                  added, deleted, labels or Ready changed  caches of EVERY group the
                                                                   node matches, before or
                                                                   after the change [P6]
    LocalModelNode        deleted, status changed                  caches named by its status
                                                                   keys and entries
    InferenceService      added, deleted, localmodel labels,       the cache its labels name
                          node-group or pvc-name annotation, or    (old and new)
                          storage URI changed [P12]
    LLMInferenceService   added, deleted, localmodel labels, LoRA  the caches its labels and
                          or node-group or pvc-name annotation,    LoRA annotation name
                          model or adapter URIs changed            (`users`)
    PV, PVC               deleted, turned Released/Failed/Lost,    the owning cache (our
                          deletion started, reclaim policy         annotation or ownerRef)
                          changed (a stale download PV set to
                          Retain before its claim goes)
    LocalModelNodeGroup   added, deleted, spec changed             caches listing the group

Status-only changes of a cache do not trigger it (its own status writes would loop).
A live `disableVolumeManagement` is read at every reconcile (`volumegate`), and
`CacheControllers.config_changed()` reconciles every cache again when it (or `volumeSource`)
changes.
(LLM)InferenceServices are optional kinds (`optional.OptionalInformer`: watched only while
KServe's CRD serves, also when installed later; reads raise `optional.NotSynced` while it
lists, so a reconcile retries instead of reading "not listed yet" as "no user"); every cache
is enqueued again when a kind starts or stops being watched. LLMInferenceServices are watched
whole: a LoRA user carries only an annotation, which no selector can select on; they are few
(each a GPU deployment) and kept slim (`llmuse.slim`).
`CacheControllers.resync()` enqueues every cache and group, the "forced resync".

Shapes in the caches (what sharing consumers must agree on): full objects compacted
(`informer.compact`) for everything but Nodes (`_slim_node`: name, labels and the Ready
condition, read only here), InferenceServices (`caching.indexes.isvc_use`: the controllers
read only their metadata and storage URI, like the webhooks) and LLMInferenceServices
(`caching.llmuse.slim`). Stores are shared: the
reconcilers never mutate what they read.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from localcache.caching import config as config_mod
from localcache.caching import indexes, llmuse
from localcache.controllers import (
    adoption,
    cachewiring,
    clustercache,
    importjobs,
    namespacecache,
    nodegroups,
    nodes,
    reconciler,
    state,
    status,
    users,
    volumegate,
)
from localcache.runtime import clock as clock_mod
from localcache.runtime import (
    controller,
    handlers,
    informer,
    keys,
    manager,
    metrics,
    predicates,
    reconcile,
    workqueue,
)
from localcache.runtime import factory as factory_mod
from localcache.runtime import kube as kube_api
from localcache.runtime.crds import optional

Obj = dict[str, Any]
DEFAULT_WORKERS = 2


@dataclass(frozen=True)
class CacheControllers:
    """What `setup` registered, for the composition root and tests."""

    cluster: controller.Controller
    namespaced: controller.Controller
    node_groups: controller.Controller
    informers: dict[str, informer.Informer]
    stores: state.Stores
    writer: nodes.LocalModelNodes
    inference_services: optional.OptionalInformer | None = None
    """KServe's InferenceServices, watched while their CRD serves (None when disabled)."""
    llm_inference_services: optional.OptionalInformer | None = None
    """KServe's LLMInferenceServices, likewise."""
    volume_management: volumegate.VolumeManagement | None = None
    """The live configuration's `disableVolumeManagement` (None with a fixed config)."""

    def config_changed(self) -> None:
        """The configuration may have changed: every cache and group is reconciled again
        when `disableVolumeManagement` or `volumeSource` changed since the last call."""
        if self.volume_management is not None and self.volume_management.flipped():
            _resync(self)

    def resync(self) -> int:
        """Enqueue every cache of both kinds and every node group; returns how many keys."""
        count = 0
        for ctl, reader in (
            (self.cluster, self.stores.caches),
            (self.namespaced, self.stores.namespace_caches),
            (self.node_groups, self.stores.node_groups),
        ):
            for key in list(reader.keys()):  # a Reader, not a dict
                ctl.queue.add(key)
                count += 1
        return count


# ------------------------------------------------------------------------ predicates


def _meta(obj: Obj) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _cache_changed(old: Obj, new: Obj) -> bool:
    a, b = _meta(old), _meta(new)
    return any(a.get(f) != b.get(f) for f in ("generation", "deletionTimestamp", "finalizers"))


def _groups_of_cache(cache: Obj) -> Iterable[keys.ObjectKey]:
    return [keys.ObjectKey("", g) for g in indexes.cache_node_groups(cache)]


# ------------------------------------------------------------------------ setup


def _controller(
    name: str,
    rec: reconcile.Reconciler,
    *,
    clock: clock_mod.Clock,
    workers: int,
    registry: metrics.Metrics,
) -> controller.Controller:
    queue = workqueue.WorkQueue(name, clock=clock, metrics=registry.workqueue(name))
    return controller.Controller(
        name, rec, queue, clock=clock, workers=workers, metrics=registry.controller(name)
    )


def setup(
    manager: manager.Manager,
    *,
    kube: kube_api.Kube,
    config: config_mod.InferenceServiceConfig | state.ConfigSource,
    metrics: metrics.Metrics,
    clock: clock_mod.Clock | None = None,
    workers: int = DEFAULT_WORKERS,
    factory: factory_mod.InformerFactory | None = None,
    import_image: str = "",
    own_pod: keys.ObjectKey | None = None,
) -> CacheControllers:
    """Register the cache controllers on `manager`, reading through informers from
    `factory` (a new one over `kube` and `clock` when None; a shared factory's informers
    run on its clock). `config` is the configuration or a function returning the one in
    force: a fixed one decides here whether InferenceServices are watched; a function is
    read at every reconcile (module docstring). Import Jobs run `import_image`, else the
    image of `own_pod`'s container (`importjobs.ImageSource`). Call before `manager.run()`."""
    clk = clock or clock_mod.SystemClock()
    shared = factory or factory_mod.InformerFactory(kube, manager, clock=clk)
    fixed = isinstance(config, config_mod.InferenceServiceConfig)
    source: state.ConfigSource = (
        (lambda: config) if isinstance(config, config_mod.InferenceServiceConfig) else config
    )
    # A live configuration is not read here: its informer syncs only once the Manager runs.
    watch_isvcs = not fixed or not source().local_model.disable_volume_management
    mode = None if fixed else volumegate.VolumeManagement(source)
    get = shared.informer
    informers = {
        "caches": get(state.LOCAL_MODEL_CACHES, indexers=state.CACHE_INDEXERS),
        "namespace_caches": get(
            state.LOCAL_MODEL_NAMESPACE_CACHES,
            indexers={**state.CACHE_INDEXERS, cachewiring.BY_PVC_REF: cachewiring.pvc_ref_index},
        ),
        "local_model_nodes": get(state.LOCAL_MODEL_NODES, indexers=state.LOCAL_MODEL_NODE_INDEXERS),
        "node_groups": get(state.LOCAL_MODEL_NODE_GROUPS),
        "nodes": get(kube_api.NODES, transform=nodes.slim_node),
        "persistent_volumes": get(kube_api.PERSISTENT_VOLUMES, indexers=state.VOLUME_INDEXERS),
        "persistent_volume_claims": get(
            kube_api.PERSISTENT_VOLUME_CLAIMS,
            indexers=state.VOLUME_INDEXERS,
            transform=adoption.observed_claim,
        ),
        "jobs": cachewiring.job_informer(shared),
    }
    isvcs: optional.OptionalInformer | None = None
    llms: optional.OptionalInformer | None = None
    if watch_isvcs:
        # KServe's CRDs may be missing or come later: watched only while they serve.
        isvcs = shared.optional_informer(
            state.INFERENCE_SERVICES,
            indexers=state.ISVC_INDEXERS,
            transform=indexes.isvc_use,
        )
        llms = shared.optional_informer(
            state.LLM_INFERENCE_SERVICES, indexers=users.LLMISVC_INDEXERS, transform=llmuse.slim
        )
    stores = state.Stores(
        caches=informers["caches"].reader(),
        namespace_caches=informers["namespace_caches"].reader(),
        nodes=informers["nodes"].reader(),
        local_model_nodes=informers["local_model_nodes"].reader(),
        node_groups=informers["node_groups"].reader(),
        persistent_volumes=informers["persistent_volumes"].reader(),
        persistent_volume_claims=informers["persistent_volume_claims"].reader(),
        inference_services=isvcs.reader() if isvcs is not None else None,
        llm_inference_services=llms.reader() if llms is not None else None,
        jobs=informers["jobs"].reader(),
    )
    reader = state.StateReader(stores)
    image = importjobs.ImageSource(kube, image=import_image, pod=own_pod)
    unmanaged = state.StateReader(
        dataclasses.replace(stores, inference_services=None, llm_inference_services=None)
    )
    recorder = status.EventRecorder(kube, instance=socket.gethostname())
    writer = nodes.LocalModelNodes(kube, store=stores.local_model_nodes, snapshot=reader.snapshot)
    built: dict[str, controller.Controller] = {}
    for sc, own in (
        (clustercache.SCOPE, informers["caches"]),
        (namespacecache.SCOPE, informers["namespace_caches"]),
    ):
        rec: reconcile.Reconciler = reconciler.CacheReconciler(
            sc,
            api=kube,
            reader=reader,
            config=source,
            recorder=recorder,
            writer=writer,
            import_image=image,
        )
        if mode is not None:
            without = reconciler.CacheReconciler(
                sc,
                api=kube,
                reader=unmanaged,
                config=source,
                recorder=recorder,
                writer=writer,
                import_image=image,
            )
            rec = volumegate.Gated(mode, managed=rec, unmanaged=without)
        ctl = _controller(sc.name, rec, clock=clk, workers=workers, registry=metrics)
        cachewiring.wire_cache_controller(sc, ctl.queue, informers, reader, (isvcs, llms))
        own.add_handler(handlers.enqueue_self(ctl.queue, predicates.funcs(updated=_cache_changed)))
        if sc.namespaced:
            cachewiring.wire(
                ctl.queue,
                caches=informers["namespace_caches"],
                claims=informers["persistent_volume_claims"],
                jobs=informers["jobs"],
                serving=(isvcs, llms),
            )
        built[sc.name] = manager.add_controller(ctl)
    usage = _controller(
        "localmodelnodegroup",
        nodegroups.NodeGroupUsageReconciler(api=kube, reader=reader),
        clock=clk,
        workers=1,
        registry=metrics,
    )
    informers["node_groups"].add_handler(
        handlers.enqueue_self(usage.queue, predicates.funcs(updated=cachewiring.spec_changed))
    )
    for name in ("caches", "namespace_caches"):
        informers[name].add_handler(
            handlers.enqueue_mapped(
                usage.queue, _groups_of_cache, predicates.funcs(updated=cachewiring.spec_changed)
            )
        )
    manager.add_controller(usage)
    handle = CacheControllers(
        cluster=built[clustercache.SCOPE.name],
        namespaced=built[namespacecache.SCOPE.name],
        node_groups=usage,
        informers=informers,
        stores=stores,
        writer=writer,
        inference_services=isvcs,
        llm_inference_services=llms,
        volume_management=mode,
    )
    for opt in (isvcs, llms):
        if opt is not None:
            # Serving volumes and `status.(llm)InferenceServices` depend on every user: when
            # the kind starts (or stops) being watched, reconcile every cache again.
            opt.on_change(lambda _availability: _resync(handle))
    return handle


def _resync(handle: CacheControllers) -> None:
    count = handle.resync()
    structlog.get_logger(__name__).info("cache_controllers_resync", keys=count)
