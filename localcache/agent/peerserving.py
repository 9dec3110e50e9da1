"""The agent's peer server as a manager runnable: this node's hashed folders
(`peersource.PeerFolders`) for trusted download pods of other nodes (`agent.peer.server`).

`PeerServing.run()` waits for the peer certificate (`tls.crt`/`tls.key` of the mounted Secret
`localcache-peer-tls`, which the controller issues and the kubelet may mount after the agent
started; looked for with a doubling delay up to `TLS_WAIT_MAX_S`, logged once), then serves on
`port` over TLS until cancelled, reloading a rotated certificate for new connections. On
cancellation new requests get 503, streams in flight get `STOP_GRACE_S`, then everything is
cancelled and awaited.

Caps: the node groups with `spec.peerDistribution.enabled` give the upload slots
(`maxUploads`) and the bandwidth (`uploadBandwidth`); a node in several such groups uses the
smallest of each (the most conservative), read at each request so a change applies at once.
A requester is served the folder its scope proved: the storage key's own or a variant; a
requester of another scope, the folder it proved it may read at an origin the groups name
(`proofOrigins`, the union over the enabled groups; `agent.peer.proofs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import structlog

from localcache.agent import peersource
from localcache.agent.peer import auth, proofs, server, throttle
from localcache.agent.peer import tls as peer_tls
from localcache.api import nodegroup, peer
from localcache.runtime import clock as clock_mod
from localcache.runtime import kube as kube_mod
from localcache.runtime import metrics as metrics_mod
from localcache.runtime import store
from localcache.runtime.serving import tls as tls_mod

log = structlog.get_logger(__name__)

TLS_WAIT_MAX_S: Final = 30.0
STOP_GRACE_S: Final = 5.0
CAPS_REFRESH_S: Final = 1.0


class _Folders:
    """`server.FolderSource` over the agent's folder index: a requester is served the folder
    (the storage key's own or a variant) that its own scope proved."""

    def __init__(self, folders: peersource.PeerFolders) -> None:
        self._folders = folders

    def scopes(self, storage_key: str) -> frozenset[str]:
        return self._folders.scopes(storage_key)

    def lookup(self, storage_key: str, scope: str) -> server.ServedFolder | None:
        found = self._folders.lookup(storage_key, scope)
        if found is None:
            return None
        return server.ServedFolder(path=found.path, manifest=found.manifest, scopes=found.scopes)

    def complete(self, storage_key: str) -> server.ServedFolder | None:
        found = self._folders.lookup(storage_key)
        if found is None or not found.manifest.complete:
            return None
        return server.ServedFolder(path=found.path, manifest=found.manifest, scopes=found.scopes)


def enabled_specs(groups: store.Reader) -> list[peer.PeerDistributionSpec]:
    """The peerDistribution of every node group that enables it (malformed groups skipped)."""
    specs: list[peer.PeerDistributionSpec] = []
    for obj in groups.list():
        try:
            spec = nodegroup.LocalModelNodeGroup.model_validate(obj).spec.peer_distribution
        except ValueError:
            continue
        if spec is not None and spec.enabled:
            specs.append(spec)
    return specs


def max_uploads(specs: Sequence[peer.PeerDistributionSpec]) -> int:
    return min((s.max_uploads for s in specs), default=peer.DEFAULT_MAX_UPLOADS)


def bandwidth(specs: Sequence[peer.PeerDistributionSpec]) -> int | None:
    caps = [
        int(s.upload_bandwidth.value)
        for s in specs
        if s.upload_bandwidth is not None and s.upload_bandwidth.value > 0
    ]
    return min(caps, default=None)


def proof_origins(specs: Sequence[peer.PeerDistributionSpec]) -> list[str]:
    """The S3 endpoints any peer-enabled node group trusts for cross-scope proofs."""
    return sorted({o for s in specs for o in s.proof_origins})


class Caps:
    """`max_uploads`, `bandwidth` and `proof_origins` of the enabled groups, recomputed at
    most once per `CAPS_REFRESH_S` (they are read per request and per streamed chunk)."""

    def __init__(self, groups: store.Reader, clock: clock_mod.Clock) -> None:
        self._groups, self._clock = groups, clock
        self._at: float | None = None
        self._uploads: int = peer.DEFAULT_MAX_UPLOADS
        self._rate: int | None = None
        self._origins: list[str] = []

    def _fresh(self) -> None:
        now = self._clock.now()
        if self._at is None or now - self._at >= CAPS_REFRESH_S:
            specs = enabled_specs(self._groups)  # every group parsed once per refresh
            self._uploads, self._rate = max_uploads(specs), bandwidth(specs)
            self._origins = proof_origins(specs)
            self._at = now

    def uploads(self) -> int:
        self._fresh()
        return self._uploads

    def rate(self) -> int | None:
        self._fresh()
        return self._rate

    def origins(self) -> list[str]:
        self._fresh()
        return self._origins


class PeerServing:
    """Runnable: the peer server of one agent (module doc)."""

    def __init__(
        self,
        *,
        kube: kube_mod.Kube,
        folders: peersource.PeerFolders,
        groups: store.Reader,
        port: int,
        tls_dir: Path,
        metrics: metrics_mod.Metrics,
        clock: clock_mod.Clock,
        host: str = "0.0.0.0",  # pods of other nodes connect to the pod IP
        on_origin_sums: Callable[[Path, str, dict[str, str]], None] | None = None,
    ) -> None:
        self._kube, self._folders, self._groups = kube, folders, groups
        self._port, self._tls_dir, self._host = port, tls_dir, host
        self._metrics, self._clock = metrics, clock
        self._on_origin_sums = on_origin_sums

    async def run(self) -> None:
        reloadable = await self._wait_for_tls()
        caps = Caps(self._groups, self._clock)
        srv = server.PeerServer(
            folders=_Folders(self._folders),
            authorizer=auth.Authorizer(auth.KubeAuthApi(self._kube)),
            slots=throttle.UploadSlots(caps.uploads),
            bucket=throttle.TokenBucket(caps.rate, clock=self._clock),
            metrics=self._metrics.peer(),
            on_refusal=lambda reason, key: log.info(
                "peer_request_refused", reason=reason, storage_key=key
            ),
            prover=proofs.Prover(
                clock=self._clock,
                origins=caps.origins,
                wall=time.time,
                on_origin_sums=self._on_origin_sums,
            ),
        )
        await srv.start(self._host, self._port, reloadable.context)
        log.info("peer_server_started", port=srv.port)
        watch = asyncio.create_task(reloadable.watch(clock=self._clock))
        try:
            await asyncio.Event().wait()
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            await srv.stop(grace_s=STOP_GRACE_S)

    async def _wait_for_tls(self) -> tls_mod.ReloadableTLS:
        delay, logged = 1.0, False
        while True:
            try:
                return peer_tls.tls_from_dir(self._tls_dir)
            except (OSError, ValueError) as exc:
                if not logged:
                    log.warning(
                        "peer_server_waiting_for_certificate", dir=str(self._tls_dir),
                        error=type(exc).__name__,
                    )  # fmt: skip
                    logged = True
            await self._clock.sleep(delay)
            delay = min(TLS_WAIT_MAX_S, delay * 2)
