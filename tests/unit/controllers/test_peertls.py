"""The peer TLS bundle's manager (controllers.peertls over runtime.serving.secretbundle) on a
fake clock: settle at once, back off on errors, re-check on the interval, renew before expiry
keeping the CA."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID

from localcache.api import peer
from localcache.controllers import peertls
from localcache.runtime import clock, errors
from localcache.runtime.serving import certgen, secretbundle
from tests.unit.runtime.test_certs import FakeStore

NOW = datetime.datetime(2026, 9, 1, 12, 0, tzinfo=datetime.UTC)
KEY = ("ops", peertls.SECRET_NAME)


class FlakyStore(FakeStore):
    """Fails the first `failures` reads with a transport error."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        if self.failures:
            self.failures -= 1
            raise errors.TransportError("apiserver down")
        return await super().get_secret(namespace, name)


def _bundle(store: FakeStore) -> certgen.CertBundle:
    bundle = certgen.bundle_from_secret(store.secrets[KEY])
    assert bundle is not None
    return bundle


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_the_peer_bundle_is_issued_at_once_for_the_peer_name_and_labelled_peer() -> None:
    store = FakeStore()
    bundles = secretbundle.SecretBundleManager(store, peertls.spec("ops"), now=lambda: NOW)
    issued = await bundles.ensure()
    assert (
        certgen.renewal_reason(
            issued, names=[peer.SERVER_NAME], now=NOW, renew_before=datetime.timedelta(days=30)
        )
        is None
    )
    secret = store.secrets[KEY]
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["labels"]["app.kubernetes.io/component"] == "peer"
    ca = x509.load_pem_x509_certificate(issued.ca_cert_pem)
    (common_name,) = ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert str(common_name.value).startswith("localcache-peer-ca@")
    assert _bundle(store) == issued


async def test_errors_back_off_doubling_and_the_loop_goes_on() -> None:
    fake = clock.FakeClock()
    store = FlakyStore(failures=3)
    bundles = secretbundle.SecretBundleManager(
        store, peertls.spec("ops"), clock=fake, now=lambda: NOW, retry_s=2.0
    )
    task = asyncio.create_task(bundles.run(), name="bundles")
    try:
        for step in (2.0, 4.0):  # after the first and second failures
            await fake.advance(0)
            assert KEY not in store.secrets
            await fake.advance(step - 0.01)
            assert fake.sleepers == 1
            await fake.advance(0.01)
        await fake.advance(8.0)  # the third failure's backoff
        assert KEY in store.secrets, "the bundle was not issued after the apiserver came back"
        writes = store.writes
        await fake.advance(bundles.check_interval_s)
        assert store.writes == writes, "a good bundle was rewritten on a re-check"
    finally:
        await _stop(task)


async def test_the_recheck_renews_before_expiry_and_keeps_the_ca() -> None:
    fake = clock.FakeClock()
    store = FakeStore()
    now = [NOW]
    bundles = secretbundle.SecretBundleManager(
        store, peertls.spec("ops"), clock=fake, now=lambda: now[0]
    )
    task = asyncio.create_task(bundles.run(), name="bundles")
    try:
        await fake.advance(0)
        first = _bundle(store)
        now[0] = first.not_after - datetime.timedelta(days=29)
        await fake.advance(bundles.check_interval_s)
        renewed = _bundle(store)
        assert renewed.serial != first.serial
        assert renewed.ca_key_pem == first.ca_key_pem
        # a fetcher still holding the first ca.crt trusts the renewed certificate
        renewed.certificate.verify_directly_issued_by(
            x509.load_pem_x509_certificate(first.ca_cert_pem)
        )
    finally:
        await _stop(task)
