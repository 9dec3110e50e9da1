"""Self-managed serving certificates for the admission server: the I/O around `certgen`.

`CertManager` loads the bundle from a Secret (or creates a CA and a serving certificate with
`certgen` and stores them with create-if-absent: `secretbundle.settle`), writes the files the
TLS server reads, patches `caBundle` into our own Mutating/ValidatingWebhookConfigurations,
and re-checks periodically so the certificate is renewed before it expires. `CertStore` is the
narrow API it needs; `CertSettings` says where the certificate lives and what it covers.

Contract:
- Replicas share one Secret. Creation is create-if-absent: on AlreadyExists the loser re-reads
  and uses the winner's bundle; renewal replaces with the read resourceVersion, so of two
  concurrent renewals one wins and the other adopts it.
- The CA is kept across serving-certificate renewals while it stays valid long enough; when it
  is itself renewed, the previous CA stays in `ca.crt` (the trust bundle) until it expires, so
  an apiserver holding either caBundle trusts the served certificate during the switch.
- A webhook configuration that does not exist is skipped with a warning (local runs); the
  periodic check patches it once it appears, and re-patches if someone reset `caBundle`.
- A Secret written by cert-manager is never touched: `ensure()` raises TerminalError instead.
- Not promised: the moment other replicas switch to a renewed certificate (their next check).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import structlog

from localcache.runtime import clock as clock_mod
from localcache.runtime import errors
from localcache.runtime.serving import certgen, secretbundle

log = structlog.get_logger(__name__)

CERT_MANAGER_ANNOTATION = secretbundle.CERT_MANAGER_ANNOTATION

ConfigurationKind = Literal["mutating", "validating"]
Now = Callable[[], datetime.datetime]


utcnow = secretbundle.utcnow


class CertStore(Protocol):
    """The API calls CertManager needs. Errors are those of `runtime.errors`:
    `NotFound` when absent, `Conflict` (`already_exists`, or a stale resourceVersion)."""

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def replace_secret(
        self, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]: ...

    async def get_webhook_configuration(
        self, kind: ConfigurationKind, name: str
    ) -> dict[str, Any]: ...

    async def patch_webhook_configuration(
        self, kind: ConfigurationKind, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class CertSettings:
    """Where the certificate lives and what it covers. `extra_names` adds DNS names or IPs
    (e.g. 127.0.0.1 for a local run); `cert_dir` receives tls.crt, tls.key and ca.crt. The
    names are the caller's (localcache's defaults are in `webhooks.setup`)."""

    cert_dir: Path
    namespace: str
    service_name: str
    secret_name: str
    extra_names: tuple[str, ...] = ()
    cluster_domain: str = "cluster.local"
    mutating_configurations: tuple[str, ...] = ()
    validating_configurations: tuple[str, ...] = ()
    cert_validity: datetime.timedelta = datetime.timedelta(days=365)
    ca_validity: datetime.timedelta = datetime.timedelta(days=3650)
    renew_before: datetime.timedelta = datetime.timedelta(days=30)
    check_interval_s: float = 3600.0

    @property
    def names(self) -> list[str]:
        base = certgen.service_dns_names(
            self.service_name, self.namespace, cluster_domain=self.cluster_domain
        )
        return base + [n for n in self.extra_names if n not in base]

    @property
    def cert_path(self) -> Path:
        return self.cert_dir / certgen.TLS_CERT_KEY

    @property
    def key_path(self) -> Path:
        return self.cert_dir / certgen.TLS_KEY_KEY

    @property
    def ca_path(self) -> Path:
        return self.cert_dir / certgen.CA_CERT_KEY


@dataclass
class CertManager:
    """Keeps the serving certificate present, shared, trusted and fresh (see module doc).

    `on_change` is called after new files were written (e.g. the TLS context's `reload`).
    """

    store: CertStore
    settings: CertSettings
    clock: clock_mod.Clock = field(default_factory=clock_mod.SystemClock)
    now: Now = utcnow
    on_change: Callable[[certgen.CertBundle], Awaitable[None] | None] | None = None
    _served: certgen.CertBundle | None = field(default=None, init=False)

    @property
    def bundle(self) -> certgen.CertBundle | None:
        """The bundle whose files were last written, if any."""
        return self._served

    async def ensure(self) -> certgen.CertBundle:
        """Load or create the shared bundle, write its files, patch caBundle; return it."""
        bundle = await self._shared_bundle()
        await self._write_files(bundle)
        await self._patch_configurations(bundle.ca_cert_pem)
        return bundle

    async def run(self) -> None:
        """Re-check every `check_interval_s` until cancelled; errors are logged and retried."""
        while True:
            await self.clock.sleep(self.settings.check_interval_s)
            try:
                await self.ensure()
            except (errors.LocalcacheError, OSError) as exc:
                log.warning("certs.check_failed", error=str(exc))

    async def _shared_bundle(self) -> certgen.CertBundle:
        s = self.settings
        spec = secretbundle.BundleSpec(
            namespace=s.namespace,
            secret_name=s.secret_name,
            names=tuple(s.names),
            cert_validity=s.cert_validity,
            ca_validity=s.ca_validity,
            renew_before=s.renew_before,
        )
        return await secretbundle.settle(self.store, spec, now=self.now)

    async def _write_files(self, bundle: certgen.CertBundle) -> None:
        s = self.settings
        if self._served == bundle and _files_hold(s, bundle):
            return
        s.cert_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(s.ca_path, bundle.ca_cert_pem, mode=0o644)
        _atomic_write(s.key_path, bundle.key_pem, mode=0o600)
        _atomic_write(s.cert_path, bundle.cert_pem, mode=0o644)
        self._served = bundle
        log.info("certs.files_written", directory=str(s.cert_dir), serial=hex(bundle.serial))
        if self.on_change is not None:
            result = self.on_change(bundle)
            if result is not None:
                await result

    async def _patch_configurations(self, ca_pem: bytes) -> None:
        targets: list[tuple[ConfigurationKind, str]] = [
            *(("mutating", n) for n in self.settings.mutating_configurations),
            *(("validating", n) for n in self.settings.validating_configurations),
        ]
        for kind, name in targets:
            try:
                config = await self.store.get_webhook_configuration(kind, name)
                ops = certgen.ca_bundle_patch(config, ca_pem)
                if ops:
                    await self.store.patch_webhook_configuration(kind, name, ops)
                    log.info("certs.ca_bundle_patched", kind=kind, configuration=name)
            except errors.NotFound:
                log.warning("certs.configuration_missing", kind=kind, configuration=name)
            except errors.ApiError as exc:
                log.error(
                    "certs.ca_bundle_patch_failed", kind=kind, configuration=name, error=str(exc)
                )


def _files_hold(settings: CertSettings, bundle: certgen.CertBundle) -> bool:
    try:
        return (
            settings.cert_path.read_bytes() == bundle.cert_pem
            and settings.key_path.read_bytes() == bundle.key_pem
            and settings.ca_path.read_bytes() == bundle.ca_cert_pem
        )
    except OSError:
        return False


def _atomic_write(path: Path, data: bytes, *, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
