"""Wiring of the node agent onto a runtime Manager: informers filtered to this node, the
work queue, the controller and the reconciler.

What the agent watches (all read through informer caches; nothing else is listed):
- its own LocalModelNode, by field selector `metadata.name=<NODE_NAME>`;
- its download Jobs, in every namespace, by label selector `node=<node label value>`;
- LocalModelNodeGroups and (unless disabled) KServe's ClusterStorageContainers, an optional
  kind (`optional.OptionalInformer`: watched while its CRD serves; without it, Jobs use
  `storageInitializer.image`; while it is listed after the CRD appeared, a reconcile that
  would pick an image retries instead; the node is reconciled again when it syncs or goes);
- the `inferenceservice-config` ConfigMap in the config namespace (by field selector);
- LocalModelCaches and LocalModelNamespaceCaches, for `modelSize` (progress percent).
ServiceAccounts and Secrets are read with GET when a Job is created, never cached; the
LocalModelNodes of a node group enabling peer distribution are LISTed (a few seconds' cache)
when one of its units launches (`agent.peering`), never watched.

The informers come from an `InformerFactory` (the process's shared one when given: several
agents and the cache controllers on one Manager then share the node-group, cache and
ConfigMap watches; the node's own LocalModelNode and Jobs are filtered per node). Every
store holds full objects (`informer.compact`) and is shared: never mutated here.

Events that enqueue the node's key: spec, label or annotation changes of the LocalModelNode
(status-only changes are ignored: the agent writes status itself), any change of one of its
Jobs, node groups, storage containers and the ConfigMap. The reconciler requeues itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from localcache.agent import peerfiles, peering, peerserving, peersource, reconciler, report
from localcache.agent.disk import folders, layout, roots
from localcache.agent.jobs import jobs, trust
from localcache.agent.peer import tls as peer_tls
from localcache.api import groupversion
from localcache.caching import config, liveconfig
from localcache.runtime import clock as clock_mod
from localcache.runtime import controller, handlers, keys, predicates, store, workqueue
from localcache.runtime import factory as factory_mod
from localcache.runtime import kube as kube_mod
from localcache.runtime import manager as manager_mod
from localcache.runtime import metrics as metrics_mod
from localcache.runtime.crds import optional

CONTROLLER_NAME: Final = "localmodelnode-agent"


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """How one agent runs. `models_root` is where the agent sees the node group's PV
    (`/mnt/models`); `host_path` is the node directory mounted there, when it differs
    (compared with the node group's PV path); `job_backoff_limit` is the Jobs' own pod
    retry count: 0 by default, so a failed pod fails its Job and the failure reaches status
    at once (spec [P17] reports only Jobs failed for good); the agent retries on its own,
    with `downloadRetryBackoffInSecs` doubling. With Kubernetes' default (None: 6 pod
    retries behind the pod backoff) a refused download looked pending for ~10 minutes.
    `progress_interval` is how often a running download's progress is refreshed, in
    seconds. `models_roots`, when given, are all the roots served (host path and where the
    agent sees it; `models_root` and `host_path` are then ignored): each node group is
    served on the root whose host path is its PV path (`agent.disk.roots`)."""

    node_name: str
    models_root: Path = layout.DEFAULT_ROOT
    host_path: str | None = None
    models_roots: tuple[roots.Root, ...] = ()
    config_namespace: str = config.DEFAULT_NAMESPACE
    config_map: str = config.CONFIGMAP_NAME
    kserve_config: keys.ObjectKey | None = None
    """KServe's ConfigMap, read under `config_map` (liveconfig.Under)."""
    job_backoff_limit: int | None = 0
    progress_interval: float = 10.0
    watch_storage_containers: bool = True
    controller_name: str = CONTROLLER_NAME
    """Distinct per agent when several agents share one process (`localcache run`)."""
    peer: peering.PeerSettings = field(default_factory=peering.PeerSettings)
    """Peer distribution (`--peer-image`, the peer CA's path, the seed wait)."""
    peer_port: int = 0
    """The peer server's port (0: not serving: `status.peer.endpoint` stays unset)."""
    pod_ip: str = ""
    """The agent pod's IP (`POD_IP`), in `status.peer.endpoint`."""
    peer_tls_dir: Path = peer_tls.DEFAULT_DIR
    """Where the peer server's certificate (Secret `localcache-peer-tls`) is mounted."""

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("the agent needs its node's name (--node-name / NODE_NAME)")
        if self.progress_interval <= 0:
            raise ValueError("progress_interval must be positive")
        roots.check_unique(self.models_roots)

    def disks(self) -> roots.Disks:
        """One `ModelDisk` per models root served."""
        if not self.models_roots:
            return roots.Disks([folders.ModelDisk(self.models_root, host_path=self.host_path)])
        return roots.Disks(
            [folders.ModelDisk(r.container_path, host_path=r.host_path) for r in self.models_roots]
        )


def setup(
    manager: manager_mod.Manager,
    *,
    kube: kube_mod.Kube,
    settings: AgentSettings,
    metrics: metrics_mod.Metrics,
    clock: clock_mod.Clock | None = None,
    factory: factory_mod.InformerFactory | None = None,
) -> peersource.PeerFolders:
    """Register the agent's controller (no leader election: one agent per node) and its
    peer file-list worker (`agent.peerfiles`) on `manager`, reading through informers from
    `factory` (a new one over `kube` and `clock` when None). `metrics` gets the controller,
    queue and download series. Call before `manager.run()`. Returns the folders its peer
    server may serve (`peersource.PeerFolders`, the server's `FolderSource`)."""
    clock = clock or clock_mod.SystemClock()
    node = settings.node_name
    shared = factory or factory_mod.InformerFactory(kube, manager, clock=clock)
    watch = shared.informer

    nodes = watch(groupversion.LOCAL_MODEL_NODE.api, field_selector=f"metadata.name={node}")
    job_informer = watch(
        kube_mod.JOBS,
        label_selector=f"{jobs.LABEL_NODE}={jobs.label_value(node)}",
        transform=trust.observed,
        page_size=trust.LIST_PAGE_SIZE,
    )
    groups = watch(groupversion.LOCAL_MODEL_NODE_GROUP.api)
    config_maps = watch(
        kube_mod.CONFIG_MAPS,
        namespace=settings.config_namespace,
        field_selector=f"metadata.name={settings.config_map}",
    )
    kserve_config_maps = None
    kserve_key = settings.kserve_config
    if kserve_key is not None:
        kserve_config_maps = watch(
            kube_mod.CONFIG_MAPS,
            namespace=kserve_key.namespace,
            field_selector=f"metadata.name={kserve_key.name}",
        )
    caches = watch(groupversion.LOCAL_MODEL_CACHE.api)
    namespace_caches = watch(groupversion.LOCAL_MODEL_NAMESPACE_CACHE.api)
    containers: optional.OptionalInformer | None = None
    if settings.watch_storage_containers:
        # KServe's CRD may be missing or come later: watched only while it serves.
        containers = shared.optional_informer(groupversion.CLUSTER_STORAGE_CONTAINER.api)

    queue = workqueue.WorkQueue(
        settings.controller_name,
        clock=clock,
        metrics=metrics.workqueue(settings.controller_name),
    )
    own_key = keys.ObjectKey("", node)
    nodes.add_handler(
        handlers.enqueue_self(
            queue,
            predicates.any_of(
                predicates.generation_changed,
                predicates.labels_changed,
                predicates.annotations_changed,
            ),
        )
    )
    job_informer.add_handler(
        handlers.enqueue_owner(
            queue,
            owner_api_version=groupversion.LOCAL_MODEL_NODE.api_version,
            owner_kind=groupversion.LOCAL_MODEL_NODE.kind,
            owner_namespaced=False,
        )
    )
    for inf in (groups, config_maps, kserve_config_maps, containers):
        if inf is not None:
            inf.add_handler(
                handlers.enqueue_mapped(
                    queue, lambda _obj: [own_key], predicates.resource_version_changed
                )
            )
    if containers is not None:
        # Which image a Job uses depends on every container: re-reconcile on (un)watching.
        containers.on_change(lambda _availability: queue.add(own_key))

    peer_files = peerfiles.PeerFiles(
        endpoint=peerfiles.endpoint(settings.pod_ip, settings.peer_port),
        on_ready=lambda: queue.add(own_key),
    )
    manager.add_runnable(f"peer-files {settings.controller_name}", peer_files, needs_leader=False)
    rec = reconciler.Reconciler(
        node_name=node,
        api=kube,
        disk=settings.disks(),
        stores=reconciler.Stores(
            nodes=nodes.reader(),
            jobs=job_informer.reader(),
            node_groups=groups.reader(),
            storage_containers=containers.reader() if containers else store.Store().view(),
            # while the CRD is new and still listed, reads raise optional.NotSynced: the
            # reconcile retries rather than fall back to the default image
            config_maps=config_maps.reader(),
            caches=caches.reader(),
            namespace_caches=namespace_caches.reader(),
        ),
        agent_metrics=report.AgentMetrics(metrics),
        config_namespace=settings.config_namespace,
        config_map=settings.config_map,
        kserve_config=(
            liveconfig.Under(kserve_config_maps.reader(), kserve_key)
            if kserve_config_maps is not None and kserve_key is not None
            else None
        ),
        clock=clock,
        job_backoff_limit=settings.job_backoff_limit,
        progress_interval=settings.progress_interval,
        peer_settings=settings.peer,
        publish_peer=peer_files.publish,
    )
    ctl = controller.Controller(
        settings.controller_name,
        rec,
        queue,
        clock=clock,
        workers=1,
        metrics=metrics.controller(settings.controller_name),
    )
    manager.add_controller(ctl, needs_leader=False)
    queue.add(own_key)
    if settings.peer_port > 0:
        serving = peerserving.PeerServing(
            kube=kube, folders=peer_files.source, groups=groups.reader(),
            port=settings.peer_port, tls_dir=settings.peer_tls_dir, metrics=metrics, clock=clock,
            on_origin_sums=peer_files.origin_sums,
        )  # fmt: skip
        manager.add_runnable(f"peer-server {settings.controller_name}", serving, needs_leader=False)
    return peer_files.source
