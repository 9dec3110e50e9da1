"""localcache's CSI node plugin: the gRPC services the kubelet calls, on two unix sockets.

- `Identity` and `Node` (CSI v1, `csi.proto`) on the plugin's endpoint: no controller service,
  no staging, no attach; `NodePublishVolume` asks `entitlement.decide` with this node's
  LocalModelNode, read from the apiserver at that moment, and builds the view
  (`views.publish`); a refusal is `PERMISSION_DENIED` with the reason, which the kubelet puts
  in the pod's `FailedMount` Event and retries with its backoff, so a serving pod starts once
  its cache is downloaded on the node;
- `Registration` (the kubelet's plugin-watcher API, `pluginregistration.proto`) on a socket in
  the kubelet's `plugins_registry`: what node-driver-registrar does, served here because that
  module is not on the Go module proxy this project builds from.

`serve()` runs both until cancelled, then stops them within `STOP_GRACE_S` and removes the
sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import grpc
import structlog

from localcache.agent.disk import layout
from localcache.api import groupversion
from localcache.csi import entitlement, views
from localcache.csi.proto import csi_pb2, csi_pb2_grpc
from localcache.csi.proto import pluginregistration_pb2 as reg_pb2
from localcache.csi.proto import pluginregistration_pb2_grpc as reg_grpc
from localcache.runtime import durable, errors, kube

_log = structlog.get_logger(__name__)

CSI_VERSIONS: Final = ("1.0.0",)
STOP_GRACE_S: Final = 5.0
READ_TIMEOUT_S: Final = 10.0
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Plugin:
    """What the plugin needs to know about its node and the paths it works on."""

    driver_name: str
    node_name: str
    roots: dict[str, Path]
    """Models roots: host path (as in the PV's attribute) -> path in this container."""
    work_dir: Path
    version: str


class LocalModelNodes:
    """Reads this node's LocalModelNode (fresh at every publish: mounts are rare)."""

    def __init__(self, client: kube.Kube, node_name: str) -> None:
        self._client = client
        self._node_name = node_name

    async def read(self) -> dict[str, Any]:
        try:
            return await self._client.get(
                groupversion.LOCAL_MODEL_NODE.api, self._node_name, request_timeout=READ_TIMEOUT_S
            )
        except errors.NotFound:
            return {}


class Identity(csi_pb2_grpc.IdentityServicer):
    def __init__(self, plugin: Plugin) -> None:
        self._plugin = plugin

    async def GetPluginInfo(self, request: Any, context: Any) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(
            name=self._plugin.driver_name, vendor_version=self._plugin.version
        )

    async def GetPluginCapabilities(
        self, request: Any, context: Any
    ) -> csi_pb2.GetPluginCapabilitiesResponse:
        return csi_pb2.GetPluginCapabilitiesResponse()

    async def Probe(self, request: Any, context: Any) -> csi_pb2.ProbeResponse:
        return csi_pb2.ProbeResponse()


class Node(csi_pb2_grpc.NodeServicer):
    def __init__(self, plugin: Plugin, nodes: LocalModelNodes) -> None:
        self._plugin = plugin
        self._nodes = nodes
        self._locks: dict[str, asyncio.Lock] = {}

    async def NodeGetCapabilities(
        self, request: Any, context: Any
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        return csi_pb2.NodeGetCapabilitiesResponse()

    async def NodeGetInfo(self, request: Any, context: Any) -> csi_pb2.NodeGetInfoResponse:
        return csi_pb2.NodeGetInfoResponse(node_id=self._plugin.node_name)

    async def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> csi_pb2.NodePublishVolumeResponse:
        target = Path(request.target_path)
        attributes = dict(request.volume_context)
        log = _log.bind(volume=request.volume_id, target=str(target))
        try:
            volume = entitlement.Volume.of(attributes)
            pod = entitlement.Pod.of(attributes)
            log = log.bind(pod=f"{pod.namespace}/{pod.name}", cache=volume.cache, role=volume.role)
            root = self._plugin.roots.get(volume.root)
            if root is None:
                raise entitlement.Refused(
                    f"models root {volume.root} is not mounted into localcache's CSI plugin "
                    f"on node {self._plugin.node_name} (it has {', '.join(self._plugin.roots)})"
                )
            node = await self._nodes.read()
            if not node:
                raise entitlement.Refused(f"node {self._plugin.node_name} has no LocalModelNode")
            record, variants = await asyncio.to_thread(_on_disk, root, volume, pod)
            grant = entitlement.decide(
                volume,
                pod,
                node=node,
                node_name=self._plugin.node_name,
                job_record=record,
                variants=variants,
            )
            async with self._lock(str(target)):
                await asyncio.to_thread(views.publish, target, root, grant, self._plugin.work_dir)
        except entitlement.Refused as exc:
            log.warning("csi_publish_refused", reason=str(exc))
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"localcache: {exc}")
        except views.ViewError as exc:
            log.error("csi_publish_failed", error=str(exc))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"localcache: {exc}")
        except errors.ApiError as exc:
            log.warning("csi_publish_unavailable", error=str(exc))
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"localcache: cannot read LocalModelNode: {exc}"
            )
        log.info("csi_published", subpath=grant.subpath, writable=grant.writable)
        return csi_pb2.NodePublishVolumeResponse()

    async def NodeUnpublishVolume(
        self,
        request: csi_pb2.NodeUnpublishVolumeRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        target = Path(request.target_path)
        try:
            async with self._lock(str(target)):
                await asyncio.to_thread(views.unpublish, target)
        except (views.ViewError, OSError) as exc:
            _log.error("csi_unpublish_failed", target=str(target), error=str(exc))
            await context.abort(grpc.StatusCode.INTERNAL, f"localcache: {exc}")
        _log.info("csi_unpublished", volume=request.volume_id, target=str(target))
        return csi_pb2.NodeUnpublishVolumeResponse()

    @contextlib.asynccontextmanager
    async def _lock(self, target: str) -> Any:
        lock = self._locks.setdefault(target, asyncio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and self._locks.get(target) is lock:
                del self._locks[target]


def _on_disk(
    root: Path, volume: entitlement.Volume, pod: entitlement.Pod
) -> tuple[dict[str, Any] | None, list[str]]:
    """What the agent wrote on the root: its record of the Job the pod's name names, and the
    folder variants of the volume's storage key."""
    if volume.role == "download":
        job = entitlement.job_of_pod(pod)
        record = durable.read_json(layout.job_record_path(root, job)) if job else None
        return record, []
    try:
        names = os.listdir(root / layout.MODELS_DIR)
    except OSError:
        names = []
    prefix = f"{volume.storage_key}."
    return None, sorted(n for n in names if n.startswith(prefix) and layout.key_of_folder(n))


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: Plugin, endpoint_for_kubelet: str) -> None:
        self._plugin = plugin
        self._endpoint = endpoint_for_kubelet
        self.registered = asyncio.Event()

    async def GetInfo(self, request: Any, context: Any) -> reg_pb2.PluginInfo:
        return reg_pb2.PluginInfo(
            type="CSIPlugin",
            name=self._plugin.driver_name,
            endpoint=self._endpoint,
            supported_versions=list(CSI_VERSIONS),
        )

    async def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: Any
    ) -> reg_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            _log.info("csi_registered_with_kubelet", driver=self._plugin.driver_name)
            self.registered.set()
        else:
            _log.error("csi_registration_failed", error=request.error)
        return reg_pb2.RegistrationStatusResponse()


def _remove_socket(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def _unix_server(path: Path, add: Callable[[grpc.aio.Server], None]) -> grpc.aio.Server:
    await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    _remove_socket(path)  # a socket left by an earlier run of the plugin
    server = grpc.aio.server()
    add(server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server


async def serve(
    plugin: Plugin,
    client: kube.Kube,
    *,
    endpoint: Path,
    registration_socket: Path,
    endpoint_for_kubelet: str,
    started: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve the CSI endpoint and the registration socket until cancelled (module doc)."""
    nodes = LocalModelNodes(client, plugin.node_name)
    await asyncio.to_thread(plugin.work_dir.mkdir, mode=0o700, parents=True, exist_ok=True)

    def add_csi(server: grpc.aio.Server) -> None:
        csi_pb2_grpc.add_IdentityServicer_to_server(Identity(plugin), server)  # type: ignore[no-untyped-call]
        csi_pb2_grpc.add_NodeServicer_to_server(Node(plugin, nodes), server)  # type: ignore[no-untyped-call]

    registration = Registration(plugin, endpoint_for_kubelet)
    csi_server = await _unix_server(endpoint, add_csi)
    try:
        reg_server = await _unix_server(
            registration_socket,
            lambda s: reg_grpc.add_RegistrationServicer_to_server(registration, s),  # type: ignore[no-untyped-call]
        )
        try:
            _log.info(
                "csi_plugin_serving",
                driver=plugin.driver_name,
                node=plugin.node_name,
                endpoint=str(endpoint),
                registration=str(registration_socket),
            )
            if started is not None:
                await started()
            await asyncio.Event().wait()
        finally:
            await reg_server.stop(STOP_GRACE_S)
            _remove_socket(registration_socket)
    finally:
        await csi_server.stop(STOP_GRACE_S)
        _remove_socket(endpoint)
