"""The composition root: builds every component explicitly and runs it under one Manager.

The only module that imports both the framework (`runtime`) and every domain package. Three
entry points, one per process shape:

- `run_controller`: the cache reconcilers plus the admission server (self-managed
  certificates by default) and the peer TLS bundle's Secret, behind a Lease when
  `--leader-elect` is on. Only the
  reconcilers need the lease: the admission server, its certificate rotation, the informers
  that feed both, /metrics and the probes serve on every replica, and a replica that loses
  the lease stops its reconcilers and campaigns again instead of exiting;
- `run_agent`: the node agent for `--node-name`;
- `run_components`: any of them in one process, on one Manager (what `localcache run` uses;
  `run_attached` is its shape against an existing cluster).

`check_apiserver` is the one apiserver probe (`/version`), of `controller`, `agent` and `run`.

Each returns the Manager's exit code: 0 after a requested stop (SIGTERM/SIGINT), non-zero when
a cache did not sync, the reconcilers did not stop in time after the lease was lost, or a
component failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from localcache import settings as settings_mod
from localcache.agent import peering
from localcache.agent import setup as agent_setup
from localcache.agent.disk import roots
from localcache.api import crdgen, groupversion
from localcache.caching import config as config_mod
from localcache.caching import liveconfig
from localcache.controllers import agenttolerations, peertls, readiness
from localcache.controllers import setup as controllers_setup
from localcache.runtime import errors, factory, informer, kube, leaderelection, manager, metrics
from localcache.runtime import logging as logging_mod
from localcache.runtime.crds import crdcheck, crdwait
from localcache.runtime.keys import ObjectKey
from localcache.runtime.serving import admission, certgen, certs, httpserver, kubecerts, tls
from localcache.webhooks import setup as webhooks_setup

_log = structlog.get_logger(__name__)

PROBE_TIMEOUT_S = 10.0
"""How long `controller` and `agent` wait for the apiserver's `/version` before giving up."""

#: How to get the CRDs whose schemas hold every field localcache writes (README "KServe's
#: CRD schema"); the controller's CRD schema check says it when a served CRD lacks some.
OWN_CRDS = tuple((kind.crd_name, kind.version) for kind in groupversion.OWN_KINDS)
CRD_WAIT_HINT = (
    "install the CRDs: KServe's (its kserve-crd or kserve-localmodel-crd chart) or "
    "localcache's (kubectl apply --server-side -k manifests/crds); this process goes on then"
)
CRD_INSTALL_HINT = (
    "install localcache's CRDs: kubectl apply --server-side --force-conflicts -f "
    "manifests/crds (or the localcache Helm chart's CRDs), and again after every upgrade of "
    "KServe's CRDs (README: KServe's CRD schema)"
)


@dataclass(frozen=True)
class Components:
    """What one process runs. `agent_nodes` lists (node name, models root) pairs."""

    controller: bool = False
    webhooks: bool = False
    agent_nodes: tuple[tuple[str, Path], ...] = ()
    extra_cert_names: tuple[str, ...] = ()


async def connect(connection: settings_mod.Connection) -> kube.Kube:
    """The API client: the kubeconfig named in settings, else in-cluster or the current one."""
    if connection.kubeconfig:
        return await kube.Kube.from_kubeconfig(connection.kubeconfig)
    return await kube.Kube.auto()


async def check_apiserver(
    connection: settings_mod.Connection, *, wait_s: float = PROBE_TIMEOUT_S
) -> None:
    """The one apiserver probe (`/version` within `wait_s`), before `controller` and `agent`
    start and when `localcache run` looks for a cluster. Raises `errors.ConfigError` for a
    kubeconfig that cannot be used or an apiserver that refuses us, `errors.TransportError`
    for one that does not answer; each message names the kubeconfig and the server."""
    kubeconfig = connection.kubeconfig
    where = f"kubeconfig {kubeconfig}" if kubeconfig else "default config"
    client = await connect(connection)
    try:
        await client.raw("/version", request_timeout=wait_s)
    except errors.TransportError as exc:
        raise errors.TransportError(
            f"the apiserver {client.server} ({where}) does not answer: {_cause(exc)}"
        ) from exc
    except errors.ApiError as exc:
        raise errors.ConfigError(
            f"the apiserver {client.server} ({where}) refused us: {exc}"
        ) from exc
    finally:
        await client.close()


def _own_pod(settings: settings_mod.Settings) -> ObjectKey | None:
    """This controller's own Pod (POD_NAMESPACE/POD_NAME, as the Deployment sets them), whose
    container image import Jobs run when `--import-image` is empty; None outside a pod."""
    if settings.command != "controller" or "identity" not in settings.given:
        return None
    return ObjectKey(settings.config.namespace, settings.leadership.identity)


def _cause(exc: BaseException) -> str:
    """The underlying reason of a transport error (aiohttp's message is the readable one)."""
    cause = exc.__cause__
    return str(cause) if cause is not None and str(cause) else str(exc)


def _config_map(informers: factory.InformerFactory, key: ObjectKey) -> informer.Informer:
    """The shared informer of the one ConfigMap `key` (every component of the process reads
    its configuration through the same watch)."""
    return informers.informer(
        kube.CONFIG_MAPS, namespace=key.namespace, field_selector=f"metadata.name={key.name}"
    )


def _config_source(
    informers: factory.InformerFactory, config: settings_mod.ConfigMaps
) -> tuple[liveconfig.LiveConfig[config_mod.InferenceServiceConfig], list[informer.Informer]]:
    """The live configuration of the controllers and webhooks (KServe's defaults until a good
    version is read), over KServe's ConfigMap when `--kserve-config` names one; and the
    informers it reads."""
    key = ObjectKey(config.namespace, config.name)
    watched = [_config_map(informers, key)]
    under = None
    if config.kserve is not None:  # read only, under localcache's own
        watched.append(_config_map(informers, config.kserve))
        under = liveconfig.Under(watched[-1].reader(), config.kserve)
    live = liveconfig.LiveConfig(
        watched[0].reader(), key, initial=config_mod.parse_config({}), under=under
    )
    return live, watched


@contextlib.asynccontextmanager
async def _webhook_server(
    server: admission.AdmissionServer,
    cert_manager: certs.CertManager | None,
    settings: settings_mod.Settings,
) -> AsyncIterator[int]:
    """Serve the admission app over TLS with hot reload. The aiohttp app is built here, when
    the Manager enters this context, so every handler registered during set-up is routed.
    With self-managed certificates the certificate is ensured first; otherwise cert-manager's
    files in the cert dir are used."""
    cert_dir = settings.webhook.cert_dir
    if cert_manager is not None:
        await cert_manager.ensure()
    reloadable = tls.ReloadableTLS(cert_dir / "tls.crt", cert_dir / "tls.key", settings.webhook.tls)
    if cert_manager is not None:

        def reload(_bundle: certgen.CertBundle) -> None:
            reloadable.reload()

        cert_manager.on_change = reload
    async with tls.serve(
        server.app(),
        host=settings.serving.bind_address,
        port=settings.webhook.port,
        ssl_context=reloadable.context,
    ) as port:
        yield port


async def run_components(
    settings: settings_mod.Settings,
    components: Components,
    *,
    client: kube.Kube | None = None,
    on_manager: Callable[[manager.Manager], None] | None = None,
    handle_signals: bool = True,
) -> int:
    """Build the Manager for `components` and run it until stopped; returns the exit code.
    `on_manager(manager)` is called once everything is registered (used by `localcache run`
    to add its own runnables, and by tests to stop it); `handle_signals=False` leaves
    SIGTERM/SIGINT alone (several managers in one process)."""
    own_client = client is None
    api = client or await connect(settings.connection)
    lead, hook, cfg = settings.leadership, settings.webhook, settings.config
    try:
        registry = metrics.Metrics()
        api.instrument(registry.rest_client())
        http = httpserver.HttpServer(
            host=settings.serving.bind_address, port=settings.serving.metrics_port, metrics=registry
        )
        elector = None
        if components.controller and lead.elect:
            elector = leaderelection.LeaderElector(
                api,
                leaderelection.LeaderElectionConfig(
                    namespace=cfg.namespace,
                    name=lead.lease_name,
                    identity=lead.identity,
                    lease_duration=lead.lease_duration,
                    renew_deadline=lead.renew_deadline,
                    retry_period=lead.retry_period,
                ),
                metrics=registry.leader_election(lead.lease_name),
            )
        server = None
        webhook_cm = None
        cert_manager: certs.CertManager | None = None
        if components.webhooks and hook.port:
            server = admission.AdmissionServer(metrics=registry)
            if hook.self_managed_certs:
                cert_manager = certs.CertManager(
                    kubecerts.KubeCertStore(api),
                    certs.CertSettings(
                        cert_dir=hook.cert_dir,
                        namespace=cfg.namespace,
                        service_name=hook.service,
                        secret_name=hook.secret,
                        mutating_configurations=(hook.mutating_configuration,),
                        validating_configurations=(hook.validating_configuration,),
                        extra_names=components.extra_cert_names,
                    ),
                )
            webhook_cm = _webhook_server(server, cert_manager, settings)
        mgr = manager.Manager(
            http_server=http,
            webhook_server=webhook_cm,
            elector=elector,
            shutdown_timeout=settings.shutdown_timeout,
            handle_signals=handle_signals,
        )
        # Started before the localmodel CRDs (KServe's chart may install them later): wait for
        # them with the probes answering, rather than crash-loop on a cache sync.
        mgr.add_prerequisite(
            "localmodel CRDs served",
            lambda: crdwait.wait_served(api, OWN_CRDS, hint=CRD_WAIT_HINT),
        )
        # One factory per Manager: every component of this process shares its informers.
        informers = factory.InformerFactory(api, mgr)
        live_config: liveconfig.LiveConfig[config_mod.InferenceServiceConfig] | None = None
        config_maps: list[informer.Informer] = []
        if components.controller or components.webhooks:
            live_config, config_maps = _config_source(informers, cfg)
        if components.controller and live_config is not None:
            caches = controllers_setup.setup(
                mgr,
                kube=api,
                config=live_config,
                metrics=registry,
                workers=settings.controller.workers,
                factory=informers,
                import_image=settings.controller.import_image,
                own_pod=_own_pod(settings),
            )
            ready_source = live_config
            ready = readiness.setup(
                mgr,
                kube_api=api,
                enabled=lambda: ready_source().local_model.serving_pods_wait_for_copy,
                metrics=registry,
                factory=informers,
                instance=lead.identity,
            )
            for inf in config_maps:  # flips of disableVolumeManagement, servingPodsWaitForCopy
                inf.add_handler(lambda _event: caches.config_changed())
                inf.add_handler(lambda _event: ready.config_changed())
        if components.controller and settings.controller.agent_daemonset:
            # the agent DaemonSet tolerates every node group's taints (README "Agent tolerations")
            agenttolerations.setup(
                mgr,
                kube=api,
                factory=informers,
                daemonset=ObjectKey(cfg.namespace, settings.controller.agent_daemonset),
                registry=registry,
                instance=lead.identity,
            )
        if components.controller:
            # the peer data plane's TLS bundle, which the agents mount (controllers/peertls.py)
            peertls.setup(mgr, kube_api=api, namespace=cfg.namespace)
            # every replica checks that the served CRDs keep the fields we write
            crdcheck.setup(
                mgr,
                informers=informers,
                api=api,
                registry=registry,
                wanted=[crdgen.crd(source) for source in crdgen.SOURCES],
                fix=CRD_INSTALL_HINT,
                instance=lead.identity,
            )
        if server is not None and live_config is not None:
            source = live_config
            webhooks_setup.setup(
                server,
                mgr,
                client=api,
                local_model_enabled=lambda: source().local_model.enabled,
                factory=informers,
                # KServe's kinds are watched while their CRDs serve (runtime.crds.optional)
                storage_containers=True,
                allow_file_uris=hook.allow_file_uris,
                namespace_share_percent=lambda: (
                    source().local_model.namespace_storage_share_percent
                ),
                # where KServe's LLMInferenceServiceConfigs live: its ConfigMap's namespace
                kserve_namespace=(
                    cfg.kserve.namespace if cfg.kserve else webhooks_setup.DEFAULT_NAMESPACE
                ),
                pods_wait_for_copy=lambda: source().local_model.serving_pods_wait_for_copy,
            )
            if cert_manager is not None:
                mgr.add_runnable("webhook-cert-rotation", cert_manager, needs_leader=False)
        agent = settings.agent
        for node_name, root in components.agent_nodes:
            agent_setup.setup(
                mgr,
                kube=api,
                settings=agent_setup.AgentSettings(
                    node_name=node_name,
                    models_root=root,
                    host_path=str(agent.host_models_root)
                    if agent.host_models_root != agent.models_root
                    else None,
                    # one agent per process: the roots it serves (local mode: one root per node)
                    models_roots=_roots(agent) if len(components.agent_nodes) == 1 else (),
                    config_namespace=cfg.namespace,
                    config_map=cfg.name,
                    kserve_config=cfg.kserve,
                    watch_storage_containers=True,
                    peer=peering.PeerSettings(image=agent.peer_image, ca_path=agent.peer_ca),
                    peer_port=agent.peer_port,
                    pod_ip=agent.pod_ip,
                    controller_name=(
                        f"{agent_setup.CONTROLLER_NAME}-{node_name}"
                        if len(components.agent_nodes) > 1
                        else agent_setup.CONTROLLER_NAME
                    ),
                ),
                metrics=registry,
                factory=informers,
            )
        if on_manager is not None:
            on_manager(mgr)
        return await mgr.run()
    finally:
        if own_client:
            await api.close()


async def run_controller(settings: settings_mod.Settings) -> int:
    return await run_components(settings, Components(controller=True, webhooks=True))


async def run_attached(settings: settings_mod.Settings, kubeconfig: Path) -> int:
    """`localcache run` attached to the cluster of `kubeconfig`: controller and webhooks, and
    the agent of `--node-name` when one is given."""
    node = settings.agent.node_name
    agents = ((node, settings.agent.models_root),) if node else ()
    attached = dataclasses.replace(settings, connection=settings_mod.Connection(str(kubeconfig)))
    components = Components(controller=True, webhooks=True, agent_nodes=agents)
    return await run_components(attached, components)


async def run_agent(settings: settings_mod.Settings) -> int:
    nodes = ((settings.agent.node_name, settings.agent.models_root),)
    return await run_components(settings, Components(agent_nodes=nodes))


def _roots(agent: settings_mod.Agent) -> tuple[roots.Root, ...]:
    """`--models-roots` as the agent's own type."""
    return tuple(roots.Root(m.host_path, m.container_path) for m in agent.models_roots)


def configure_logging(settings: settings_mod.Logging) -> None:
    logging_mod.configure(level=settings.level, renderer=settings.format)


__all__: Sequence[str] = (
    "Components",
    "run_agent",
    "run_components",
    "run_controller",
)
