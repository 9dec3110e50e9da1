"""A certificate bundle kept in one Secret: the shared core of self-managed certificates.

- `settle(store, spec, now=...)` returns the bundle the Secret holds when it is still good for
  `spec` (`certgen.renewal_reason`), else issues one (`certgen.issue_bundle`, keeping the CA
  as certgen does) and stores it: create-if-absent, or replace with the resourceVersion read.
  Of two writers racing, one wins and the other re-reads and returns the winner's bundle.
  The admission server's `certs.CertManager` and the peer TLS bundle both use it.
- `SecretBundleManager` keeps one Secret's bundle present and fresh on its own: `run()`
  settles it at once, then every `check_interval_s`; a failure (apiserver down, RBAC) is
  logged and retried with doubling backoff from `retry_s` up to `check_interval_s`, never
  ending the loop. It is for bundles a process publishes but does not serve (its readers,
  e.g. pods mounting the Secret, pick the renewed files up themselves).

Contract: a Secret annotated by cert-manager is never written (`errors.TerminalError`). Not
promised: when readers see a renewed bundle (a mounted Secret is refreshed by the kubelet).
Key material is never logged.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from localcache.runtime import clock as clock_mod
from localcache.runtime import errors
from localcache.runtime.serving import certgen

log = structlog.get_logger(__name__)

CERT_MANAGER_ANNOTATION = "cert-manager.io/certificate-name"
SETTLE_TRIES = 5
Now = Callable[[], datetime.datetime]


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class SecretStore(Protocol):
    """The Secret calls `settle` needs. Errors are those of `runtime.errors`: `NotFound` when
    absent, `Conflict` (`already_exists`, or a stale resourceVersion)."""

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def replace_secret(
        self, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class BundleSpec:
    """Which Secret holds the bundle and what its serving certificate covers. `component`
    labels the Secret (`app.kubernetes.io/component`) and names the CA."""

    namespace: str
    secret_name: str
    names: tuple[str, ...]
    component: str = "webhook"
    cert_validity: datetime.timedelta = datetime.timedelta(days=365)
    ca_validity: datetime.timedelta = datetime.timedelta(days=3650)
    renew_before: datetime.timedelta = datetime.timedelta(days=30)


async def settle(store: SecretStore, spec: BundleSpec, *, now: Now) -> certgen.CertBundle:
    """The Secret's bundle, issued or renewed first when it must be (module docstring)."""
    where = f"Secret {spec.namespace}/{spec.secret_name}"
    for _ in range(SETTLE_TRIES):
        try:
            secret: dict[str, Any] | None = await store.get_secret(spec.namespace, spec.secret_name)
        except errors.NotFound:
            secret = None
        annotations = ((secret or {}).get("metadata") or {}).get("annotations") or {}
        if CERT_MANAGER_ANNOTATION in annotations:
            raise errors.TerminalError(
                f"{where} is managed by cert-manager: turn self-managed certificates off"
            )
        current = certgen.bundle_from_secret(secret) if secret is not None else None
        reason = certgen.renewal_reason(
            current, names=spec.names, now=now(), renew_before=spec.renew_before
        )
        if reason is None and current is not None:
            return current
        fresh = certgen.issue_bundle(
            spec.names,
            now=now(),
            cert_validity=spec.cert_validity,
            ca_validity=spec.ca_validity,
            previous=current,
            ca_name=f"localcache-{spec.component}-ca",
        )
        rv = None if secret is None else (secret.get("metadata") or {}).get("resourceVersion")
        body = certgen.secret_body(
            fresh,
            name=spec.secret_name,
            namespace=spec.namespace,
            resource_version=rv,
            component=spec.component,
        )
        try:
            if secret is None:
                await store.create_secret(spec.namespace, body)
            else:
                await store.replace_secret(spec.namespace, spec.secret_name, body)
        except errors.Conflict:
            log.info("certs.lost_race", secret_name=spec.secret_name, namespace=spec.namespace)
            continue
        log.info(
            "certs.issued",
            secret_name=spec.secret_name,
            namespace=spec.namespace,
            reason=reason,
            serial=hex(fresh.serial),
        )
        return fresh
    raise errors.TerminalError(f"could not settle {where} after {SETTLE_TRIES} tries")


@dataclass
class SecretBundleManager:
    """Keeps `spec`'s Secret holding a valid, fresh bundle (module docstring); a Runnable."""

    store: SecretStore
    spec: BundleSpec
    clock: clock_mod.Clock = field(default_factory=clock_mod.SystemClock)
    now: Now = utcnow
    check_interval_s: float = 3600.0
    retry_s: float = 2.0
    _bundle: certgen.CertBundle | None = field(default=None, init=False)

    @property
    def bundle(self) -> certgen.CertBundle | None:
        """The bundle last settled, if any."""
        return self._bundle

    async def ensure(self) -> certgen.CertBundle:
        """Settle the Secret once and return its bundle (errors propagate)."""
        self._bundle = await settle(self.store, self.spec, now=self.now)
        return self._bundle

    async def run(self) -> None:
        """Settle now, then every `check_interval_s`, until cancelled (failures back off)."""
        delay = self.retry_s
        while True:
            try:
                await self.ensure()
            except (errors.LocalcacheError, OSError) as exc:
                log.warning(
                    "certs.settle_failed",
                    secret_name=self.spec.secret_name,
                    namespace=self.spec.namespace,
                    error=str(exc),
                    retry_in_s=delay,
                )
                await self.clock.sleep(delay)
                delay = min(delay * 2, self.check_interval_s)
                continue
            delay = self.retry_s
            await self.clock.sleep(self.check_interval_s)
