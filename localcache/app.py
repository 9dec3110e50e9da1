"""The composition root: builds every component explicitly and runs it under one Manager.

The only module that imports both the framework (`runtime`) and every domain package. Three
entry points, one per process shape:

- `run_controller`: the cache reconcilers plus the admission server (self-managed
  certificates by default), behind a Lease when `--leader-elect` is on. Only the
  reconcilers need the lease: the admission server, its certificate rotation, the informers
  that feed both, /metrics and the probes serve on every replica, and a replica that loses
  the lease stops its reconcilers and campaigns again instead of exiting;
- `run_agent`: the node agent for `--node-name`;
- `run_components`: any of them in one process, on one Manager (what `localcache run` uses).

Each returns the Manager's exit code: 0 after a requested stop (SIGTERM/SIGINT), non-zero when
a cache did not sync, the reconcilers did not stop in time after the lease was lost, or a
component failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog

from localcache import settings as settings_mod
from localcache.agent import setup as agent_setup
from localcache.api import crdgen, groupversion
from localcache.caching import config as config_mod
from localcache.caching import liveconfig
from localcache.controllers import setup as controllers_setup
from localcache.runtime import (
    admission,
    crdcheck,
    crdwait,
    factory,
    httpserver,
    kube,
    leaderelection,
    manager,
    metrics,
    tls,
)
from localcache.runtime import logging as logging_mod
from localcache.runtime.keys import ObjectKey
from localcache.webhooks import certgen, certs
from localcache.webhooks import setup as webhooks_setup

_log = structlog.get_logger(__name__)

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


class KubeCertStore:
    """`certs.CertStore` over the Kube client: Secrets and webhook configurations."""

    def __init__(self, client: kube.Kube) -> None:
        self._kube = client

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._kube.get(kube.SECRETS, name, namespace=namespace)

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._kube.create(kube.SECRETS, body, namespace=namespace)

    async def replace_secret(
        self, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        del name  # the body's metadata names the Secret
        return await self._kube.replace(kube.SECRETS, body, namespace=namespace)

    async def get_webhook_configuration(self, kind: str, name: str) -> dict[str, Any]:
        return await self._kube.get(_webhook_resource(kind), name)

    async def patch_webhook_configuration(
        self, kind: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return await self._kube.patch(_webhook_resource(kind), name, ops, patch_type="json")


def _webhook_resource(kind: str) -> kube.Resource:
    if kind == "mutating":
        return kube.MUTATING_WEBHOOK_CONFIGURATIONS
    return kube.VALIDATING_WEBHOOK_CONFIGURATIONS


async def connect(settings: settings_mod.Settings) -> kube.Kube:
    """The API client: the kubeconfig named in settings, else in-cluster or the current one."""
    if settings.kubeconfig:
        return await kube.Kube.from_kubeconfig(settings.kubeconfig)
    return await kube.Kube.auto()


def _config_source(
    informers: factory.InformerFactory, settings: settings_mod.Settings
) -> liveconfig.LiveConfig[config_mod.InferenceServiceConfig]:
    """The live configuration, read from the shared ConfigMap informer (the node agents of
    the same process watch the same ConfigMap through it)."""
    inf = informers.informer(
        kube.CONFIG_MAPS,
        namespace=settings.config_namespace,
        field_selector=f"metadata.name={settings.config_map}",
    )
    key = ObjectKey(settings.config_namespace, settings.config_map)
    return liveconfig.LiveConfig(
        inf.reader(),
        key,
        initial=config_mod.parse_config({}),
        under=_kserve_config(informers, settings.kserve_config),
    )


def _kserve_config(
    informers: factory.InformerFactory, namespaced_name: str
) -> liveconfig.Under | None:
    """KServe's ConfigMap (`--kserve-config namespace/name`), read only, or None."""
    if not namespaced_name:
        return None
    namespace, name = namespaced_name.split("/")
    inf = informers.informer(
        kube.CONFIG_MAPS, namespace=namespace, field_selector=f"metadata.name={name}"
    )
    return liveconfig.Under(inf.reader(), ObjectKey(namespace, name))


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
    cert_dir = settings.webhook_cert_dir
    if cert_manager is not None:
        await cert_manager.ensure()
    reloadable = tls.ReloadableTLS(cert_dir / "tls.crt", cert_dir / "tls.key")
    if cert_manager is not None:

        def reload(_bundle: certgen.CertBundle) -> None:
            reloadable.reload()

        cert_manager.on_change = reload
    async with tls.serve(
        server.app(),
        host=settings.bind_address,
        port=settings.webhook_port,
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
    api = client or await connect(settings)
    try:
        registry = metrics.Metrics()
        api.instrument(registry.rest_client())
        http = httpserver.HttpServer(
            host=settings.bind_address, port=settings.metrics_port, metrics=registry
        )
        elector = None
        if components.controller and settings.leader_elect:
            elector = leaderelection.LeaderElector(
                api,
                leaderelection.LeaderElectionConfig(
                    namespace=settings.config_namespace,
                    name=settings.lease_name,
                    identity=settings.identity,
                    lease_duration=settings.lease_duration,
                    renew_deadline=settings.renew_deadline,
                    retry_period=settings.retry_period,
                ),
                metrics=registry.leader_election(settings.lease_name),
            )
        server = None
        webhook_cm = None
        cert_manager: certs.CertManager | None = None
        if components.webhooks and settings.webhook_port:
            server = admission.AdmissionServer(metrics=registry)
            if settings.self_managed_certs:
                cert_manager = certs.CertManager(
                    KubeCertStore(api),
                    certs.CertSettings(
                        cert_dir=settings.webhook_cert_dir,
                        namespace=settings.config_namespace,
                        service_name=settings.webhook_service,
                        secret_name=settings.webhook_secret,
                        mutating_configurations=(settings.mutating_webhook_configuration,),
                        validating_configurations=(settings.validating_webhook_configuration,),
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
        if components.controller or components.webhooks:
            live_config = _config_source(informers, settings)
        if components.controller and live_config is not None:
            controllers_setup.setup(
                mgr,
                kube=api,
                config=live_config,
                metrics=registry,
                workers=settings.workers,
                factory=informers,
            )
        if components.controller:
            # every replica checks that the served CRDs keep the fields we write
            crdcheck.setup(
                mgr,
                informers=informers,
                api=api,
                registry=registry,
                wanted=[crdgen.crd(source) for source in crdgen.SOURCES],
                fix=CRD_INSTALL_HINT,
                instance=settings.identity,
            )
        if server is not None and live_config is not None:
            source = live_config
            webhooks_setup.setup(
                server,
                mgr,
                client=api,
                local_model_enabled=lambda: source().local_model.enabled,
                factory=informers,
                # KServe's kinds are watched while their CRDs serve (runtime.optional)
                storage_containers=True,
                allow_file_uris=settings.allow_file_uris,
            )
            if cert_manager is not None:
                mgr.add_runnable("webhook-cert-rotation", cert_manager, needs_leader=False)
        for node_name, root in components.agent_nodes:
            agent_setup.setup(
                mgr,
                kube=api,
                settings=agent_setup.AgentSettings(
                    node_name=node_name,
                    models_root=root,
                    host_path=str(settings.host_models_root)
                    if settings.host_models_root != settings.models_root
                    else None,
                    # one agent per process: the roots it serves (local mode: one root per node)
                    models_roots=settings.models_roots if len(components.agent_nodes) == 1 else (),
                    config_namespace=settings.config_namespace,
                    config_map=settings.config_map,
                    kserve_config=settings.kserve_config,
                    watch_storage_containers=True,
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


async def run_agent(settings: settings_mod.Settings) -> int:
    nodes = ((settings.node_name, settings.models_root),)
    return await run_components(settings, Components(agent_nodes=nodes))


def configure_logging(settings: settings_mod.Settings) -> None:
    renderer: Literal["json", "console"] = "console" if settings.log_format == "console" else "json"
    logging_mod.configure(level=settings.log_level, renderer=renderer)


__all__: Sequence[str] = (
    "Components",
    "run_agent",
    "run_components",
    "run_controller",
)
