"""Wiring of the admission webhooks: informers on the Manager, handlers on the AdmissionServer.

`setup()` takes four informers (LocalModelCache, LocalModelNamespaceCache in all
namespaces, LocalModelNodeGroup, Node: the mutation picks the node group whose nodes the
workload can run on; the controller of the same process watches Nodes with the same
transform, so this costs no second watch), and optional ones (`optional.OptionalInformer`:
watched only while KServe's CRD serves, so the webhooks start without KServe) on
InferenceServices, LLMInferenceServices (`caching.llmuse.slim`, read by delete validation) and
LLMInferenceServiceConfigs (the `spec.baseRefs` of LLMInferenceServices) in all namespaces
and, when `storage_containers` is on, on KServe's ClusterStorageContainers (the validators
accept URIs they claim), from an
`InformerFactory`, with the indexes the handlers read (the process's shared factory when
given, so the cache controllers of the same Manager reuse the same watches and caches; the
Manager starts them and gates /readyz on their sync), and registers four handlers at the
paths of `manifests/webhook/`:
- `isvc.MUTATE_PATH`: InferenceService mutation; a handler failure is answered with an HTTP
  error so the configuration's `failurePolicy: Ignore` admits the ISVC unchanged;
- `llmisvc.MUTATE_PATH`: LLMInferenceService mutation (v1alpha1 and v1alpha2), the same way;
  it reads LLMInferenceServiceConfigs in the object's namespace, then in `kserve_namespace`
  (KServe's, where its controller looks them up), and never waits for their informer (an
  unsynced or absent kind is a warning on the request, `llmbase`);
- `podwait.MUTATE_PATH`: Pod CREATE mutation (serving pods wait for their copy); a failure is
  an HTTP error, so `failurePolicy: Ignore` admits the pod unchanged;
- `validation.CACHE_PATH`, `validation.NAMESPACE_CACHE_PATH`: cache validation; a handler
  failure is a denial (the configuration's policy is Fail anyway).
Handlers answer from the stores (no API call per request, but for cache validation's read of
a node group its store has not caught up with: `livegroups`); until every store has synced
(an optional kind: while its informer lists after its CRD appeared; an absent kind reads as
empty), mutation admits unchanged with a warning and validation denies with 503.

The InferenceService informer keeps only apiVersion, kind, metadata and the predictor's
storage URI (`caching.indexes.isvc_use`: the handlers read labels and that URI), so watching
every ISVC of the cluster costs little memory; the caches and node groups are full objects
(`informer.compact`), Nodes only name, labels and Ready (`caching.indexes.slim_node`). Those
are the transforms the cache controllers use too, so a shared factory serves both from one
informer each. The returned `Webhooks` exposes the informers
(read-only: shared stores).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from localcache.api import groupversion
from localcache.caching import config as config_mod
from localcache.caching import indexes, llmuse
from localcache.runtime import clock as clock_mod
from localcache.runtime import factory as factory_mod
from localcache.runtime import informer, kube
from localcache.runtime import manager as manager_mod
from localcache.runtime.crds import optional
from localcache.runtime.serving import admission
from localcache.webhooks import isvc, isvchandler, livegroups, llmisvc, podwait, validation

Obj = dict[str, Any]

# Where the shipped manifests (manifests/webhook/) put the admission server, its serving
# certificate and its two configurations: what `runtime.serving.certs.CertSettings` is given.
DEFAULT_NAMESPACE = "kserve"
DEFAULT_SERVICE_NAME = "localmodel-webhook-server-service"
DEFAULT_SECRET_NAME = "localmodel-webhook-server-cert"
MUTATING_CONFIGURATION = "localmodel.inferenceservice.serving.kserve.io"
VALIDATING_CONFIGURATION = "localmodelcache.serving.kserve.io"


@dataclass(frozen=True)
class Webhooks:
    """What `setup()` built: the informers and the registered handlers."""

    caches: informer.Informer
    namespace_caches: informer.Informer
    node_groups: informer.Informer
    nodes: informer.Informer
    inference_services: optional.OptionalInformer
    llm_configs: optional.OptionalInformer
    storage_containers: optional.OptionalInformer | None
    llm_inference_services: optional.OptionalInformer
    mutator: isvchandler.IsvcMutator
    llm_mutator: llmisvc.LlmIsvcMutator
    pod_mutator: podwait.PodWaitMutator
    cache_validator: validation.CacheValidator
    namespace_cache_validator: validation.CacheValidator

    def synced(self) -> bool:
        """True once every informer the handlers read has synced (an optional kind: is
        not being listed right now)."""
        return _all_synced(
            (self.caches, self.namespace_caches, self.node_groups, self.nodes),
            (
                self.inference_services,
                self.llm_configs,
                self.storage_containers,
                self.llm_inference_services,
            ),
        )


def _all_synced(
    required: Iterable[informer.Informer], optionals: Iterable[optional.OptionalInformer | None]
) -> bool:
    """Every `required` informer has synced and no present optional one is listing."""
    return all(inf.synced.is_set() for inf in required) and all(
        opt.settled() for opt in optionals if opt is not None
    )


def setup(
    server: admission.AdmissionServer,
    manager: manager_mod.Manager,
    *,
    client: kube.Kube,
    local_model_enabled: Callable[[], bool],
    clock: clock_mod.Clock | None = None,
    factory: factory_mod.InformerFactory | None = None,
    storage_containers: bool = False,
    allow_file_uris: bool = False,
    namespace_share_percent: Callable[[], int] | None = None,
    kserve_namespace: str = DEFAULT_NAMESPACE,
    pods_wait_for_copy: Callable[[], bool] = lambda: True,
) -> Webhooks:
    """Register the webhook handlers on `server`, reading through informers from `factory`
    (a new one over `client` and `clock` on `manager` when None).

    `local_model_enabled` returns the current `localModel.enabled` of the
    inferenceservice-config ConfigMap (read on every ISVC admission);
    `pods_wait_for_copy` its `localModel.servingPodsWaitForCopy` (read on every pod
    admission). Call before `server.app()` and before `manager.run()`.
    """
    shared = factory or factory_mod.InformerFactory(client, manager, clock=clock)

    def make(
        info: groupversion.KindInfo,
        indexers: dict[str, Callable[[Obj], list[str]]],
        transform: informer.Transform = informer.compact,
    ) -> informer.Informer:
        return shared.informer(info.api, indexers=indexers, transform=transform)

    caches = make(
        groupversion.LOCAL_MODEL_CACHE,
        {
            validation.NODE_GROUP_INDEX: indexes.cache_node_groups,
            podwait.SERVING_CLAIM_INDEX: podwait.index_serving_claims,
        },
    )
    namespace_caches = make(
        groupversion.LOCAL_MODEL_NAMESPACE_CACHE,
        {
            validation.NODE_GROUP_INDEX: indexes.cache_node_groups,
            validation.NAME_INDEX: indexes.cache_name,
            podwait.SERVING_CLAIM_INDEX: podwait.index_serving_claims,
        },
    )
    node_groups = make(groupversion.LOCAL_MODEL_NODE_GROUP, {})
    nodes = shared.informer(kube.NODES, transform=indexes.slim_node)
    # KServe's kinds: watched only while their CRDs serve (they may come later, or go).
    isvcs = shared.optional_informer(
        groupversion.INFERENCE_SERVICE.api,
        indexers={validation.USED_CACHE_INDEX: indexes.isvc_used_cache},
        transform=indexes.isvc_use,
    )
    llm_configs = shared.optional_informer(
        groupversion.LLM_INFERENCE_SERVICE_CONFIG.api, transform=llmisvc.config_use
    )
    llmisvcs = shared.optional_informer(
        groupversion.LLM_INFERENCE_SERVICE.api,
        indexers={llmuse.USED_CACHE_INDEX: llmuse.used_caches},
        transform=llmuse.slim,
    )
    containers = (
        shared.optional_informer(groupversion.CLUSTER_STORAGE_CONTAINER.api)
        if storage_containers
        else None
    )
    required = (caches, namespace_caches, node_groups, nodes)

    def required_synced() -> bool:
        return _all_synced(required, ())

    def synced() -> bool:
        return _all_synced(required, (isvcs, containers, llmisvcs))

    mutator = isvchandler.IsvcMutator(
        caches=caches.reader(),
        namespace_caches=namespace_caches.reader(),
        node_groups=node_groups.reader(),
        nodes=nodes.reader(),
        enabled=local_model_enabled,
        synced=required_synced,  # mutation reads no ISVC: a listing ISVC kind must not skip it
    )
    llm_mutator = llmisvc.LlmIsvcMutator(
        caches=caches.reader(),
        namespace_caches=namespace_caches.reader(),
        node_groups=node_groups.reader(),
        nodes=nodes.reader(),
        configs=llm_configs.reader(),
        configs_served=lambda: llm_configs.availability is not optional.Availability.ABSENT,
        kserve_namespace=kserve_namespace,
        enabled=local_model_enabled,
        synced=required_synced,
    )
    validators = [
        validation.CacheValidator(
            namespaced=namespaced,
            caches=caches.reader(),
            namespace_caches=namespace_caches.reader(),
            node_groups=node_groups.reader(),
            inference_services=isvcs.reader(),
            llm_inference_services=llmisvcs.reader(),
            synced=synced,
            storage_containers=containers.reader() if containers else None,
            allow_file_uris=allow_file_uris,
            namespace_share_percent=namespace_share_percent
            or (lambda: config_mod.DEFAULT_NAMESPACE_SHARE_PERCENT),
            read_node_group=livegroups.reader(client),
        )
        for namespaced in (False, True)
    ]
    pod_mutator = podwait.PodWaitMutator(
        caches=caches.reader(),
        namespace_caches=namespace_caches.reader(),
        enabled=pods_wait_for_copy,
        synced=required_synced,
    )
    server.register(isvc.MUTATE_PATH, mutator, on_failure="error")
    server.register(llmisvc.MUTATE_PATH, llm_mutator, on_failure="error")
    server.register(podwait.MUTATE_PATH, pod_mutator, on_failure="error")
    server.register(validation.CACHE_PATH, validators[0], on_failure="deny")
    server.register(validation.NAMESPACE_CACHE_PATH, validators[1], on_failure="deny")
    return Webhooks(
        caches=caches,
        namespace_caches=namespace_caches,
        node_groups=node_groups,
        nodes=nodes,
        inference_services=isvcs,
        llm_configs=llm_configs,
        storage_containers=containers,
        llm_inference_services=llmisvcs,
        mutator=mutator,
        llm_mutator=llm_mutator,
        pod_mutator=pod_mutator,
        cache_validator=validators[0],
        namespace_cache_validator=validators[1],
    )
