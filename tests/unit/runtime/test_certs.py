"""Self-managed certificates: pure issuance and renewal, and CertManager over an in-memory store."""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from localcache.runtime import clock, errors
from localcache.runtime.serving import certgen, certs

NOW = datetime.datetime(2026, 9, 1, 12, 0, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)
NAMES = [*certgen.service_dns_names("hook", "kserve"), "127.0.0.1"]


def _sans(bundle: certgen.CertBundle) -> tuple[list[str], list[str]]:
    san = bundle.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName), [
        str(i) for i in san.get_values_for_type(x509.IPAddress)
    ]


def _ca(bundle: certgen.CertBundle) -> x509.Certificate:
    return x509.load_pem_x509_certificates(bundle.ca_cert_pem)[0]


# ------------------------------------------------------------------------ pure logic


def test_service_dns_names_cover_every_in_cluster_form() -> None:
    assert certgen.service_dns_names("svc", "ns") == [
        "svc",
        "svc.ns",
        "svc.ns.svc",
        "svc.ns.svc.cluster.local",
    ]
    assert certgen.service_dns_names("s", "n", cluster_domain="corp")[-1] == "s.n.svc.corp"


def test_issued_certificate_has_dns_and_ip_sans_and_is_signed_by_its_ca() -> None:
    bundle = certgen.issue_bundle(NAMES, now=NOW)
    dns, ips = _sans(bundle)
    assert dns == NAMES[:4]
    assert ips == ["127.0.0.1"]
    cert, ca = bundle.certificate, _ca(bundle)
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert bundle.not_after == NOW + datetime.timedelta(days=365)


def test_issuing_needs_a_name() -> None:
    with pytest.raises(ValueError, match="at least one name"):
        certgen.issue_bundle([], now=NOW)


def test_a_fresh_bundle_needs_no_renewal() -> None:
    bundle = certgen.issue_bundle(NAMES, now=NOW)
    assert certgen.renewal_reason(bundle, names=NAMES, now=NOW, renew_before=30 * DAY) is None


@pytest.mark.parametrize(
    ("age", "expected"),
    [
        (334 * DAY, None),
        (336 * DAY, "certificate expires within the renewal threshold"),
        (400 * DAY, "certificate expires within the renewal threshold"),
    ],
)
def test_renewal_is_due_within_the_threshold_before_expiry(
    age: datetime.timedelta, expected: str | None
) -> None:
    bundle = certgen.issue_bundle(NAMES, now=NOW)
    later = NOW + age
    assert certgen.renewal_reason(bundle, names=NAMES, now=later, renew_before=30 * DAY) == expected


def test_renewal_is_due_when_a_name_is_missing_or_nothing_is_stored() -> None:
    bundle = certgen.issue_bundle(NAMES[:1], now=NOW)
    reason = certgen.renewal_reason(bundle, names=NAMES, now=NOW, renew_before=DAY)
    assert reason is not None
    assert "127.0.0.1" in reason
    assert certgen.renewal_reason(None, names=NAMES, now=NOW, renew_before=DAY) is not None


def test_renewal_is_due_for_garbage_or_mismatched_material() -> None:
    good = certgen.issue_bundle(NAMES, now=NOW)
    other = certgen.issue_bundle(NAMES, now=NOW)
    cases = {
        "does not parse": certgen.CertBundle(good.ca_cert_pem, good.ca_key_pem, b"junk", b"junk"),
        "key does not match": certgen.CertBundle(
            good.ca_cert_pem, good.ca_key_pem, good.cert_pem, other.key_pem
        ),
        "not signed by the stored CA": certgen.CertBundle(
            other.ca_cert_pem, other.ca_key_pem, good.cert_pem, good.key_pem
        ),
    }
    for fragment, bundle in cases.items():
        reason = certgen.renewal_reason(bundle, names=NAMES, now=NOW, renew_before=DAY)
        assert reason is not None
        assert fragment in reason


def test_renewal_keeps_a_long_lived_ca() -> None:
    first = certgen.issue_bundle(NAMES, now=NOW)
    later = NOW + 340 * DAY
    second = certgen.issue_bundle(NAMES, now=later, previous=first)
    assert second.ca_cert_pem == first.ca_cert_pem
    assert second.serial != first.serial
    second.certificate.verify_directly_issued_by(_ca(first))


def test_renewing_an_expiring_ca_keeps_the_old_ca_trusted() -> None:
    first = certgen.issue_bundle(NAMES, now=NOW, ca_validity=100 * DAY, cert_validity=90 * DAY)
    later = NOW + 80 * DAY
    assert certgen.renewal_reason(first, names=NAMES, now=later, renew_before=30 * DAY)
    second = certgen.issue_bundle(
        NAMES, now=later, ca_validity=100 * DAY, cert_validity=90 * DAY, previous=first
    )
    trusted = x509.load_pem_x509_certificates(second.ca_cert_pem)
    assert [c.serial_number for c in trusted] == [
        _ca(second).serial_number,
        _ca(first).serial_number,
    ]
    assert _ca(second).serial_number != _ca(first).serial_number
    second.certificate.verify_directly_issued_by(trusted[0])
    assert certgen.renewal_reason(second, names=NAMES, now=later, renew_before=30 * DAY) is None


def test_secret_round_trip_preserves_the_bundle() -> None:
    bundle = certgen.issue_bundle(NAMES, now=NOW)
    body = certgen.secret_body(bundle, name="s", namespace="ns", resource_version="7")
    assert body["type"] == "kubernetes.io/tls"
    assert set(body["data"]) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert body["metadata"]["resourceVersion"] == "7"
    assert certgen.bundle_from_secret(body) == bundle
    del body["data"]["ca.key"]
    assert certgen.bundle_from_secret(body) is None
    garbage = {k: "%%%" for k in ("ca.crt", "ca.key", "tls.crt", "tls.key")}
    assert certgen.bundle_from_secret({"data": garbage}) is None


def test_ca_bundle_patch_touches_only_entries_that_differ() -> None:
    ca = b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"
    encoded = base64.b64encode(ca).decode()
    config = {
        "webhooks": [
            {"name": "a.x.io", "clientConfig": {"caBundle": encoded}},
            {"name": "b.x.io", "clientConfig": {"service": {"name": "s"}}},
            {"name": "c.x.io"},
        ]
    }
    ops = certgen.ca_bundle_patch(config, ca)
    assert ops == [
        {"op": "test", "path": "/webhooks/1/name", "value": "b.x.io"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": encoded},
        {"op": "test", "path": "/webhooks/2/name", "value": "c.x.io"},
        {"op": "add", "path": "/webhooks/2/clientConfig", "value": {}},
        {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": encoded},
    ]
    assert certgen.ca_bundle_patch(_apply(config, ops), ca) == []


# ---------------------------------------------------------------------- CertManager


def _apply(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = op["path"].split("/")[1:]
        node: Any = doc
        for token in parents:
            node = node[int(token)] if isinstance(node, list) else node[token]
        if op["op"] == "test":
            if node[last] != op["value"]:
                raise errors.Invalid(422, "test failed")
        else:
            node[last] = op["value"]
    return doc


class FakeStore:
    """An in-memory CertStore; `await asyncio.sleep(0)` in each call lets callers interleave."""

    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.configs: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes = 0
        self._rv = 0

    def _stamp(self, body: dict[str, Any]) -> dict[str, Any]:
        self._rv += 1
        self.writes += 1
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(self._rv)
        return body

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        await asyncio.sleep(0)
        try:
            return copy.deepcopy(self.secrets[(namespace, name)])
        except KeyError:
            raise errors.NotFound(404, "not found") from None

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        key = (namespace, body["metadata"]["name"])
        if key in self.secrets:
            raise errors.Conflict(409, "exists", reason="AlreadyExists")
        self.secrets[key] = self._stamp(body)
        return self.secrets[key]

    async def replace_secret(
        self, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        await asyncio.sleep(0)
        current = self.secrets[(namespace, name)]
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise errors.Conflict(409, "stale", reason="Conflict")
        self.secrets[(namespace, name)] = self._stamp(body)
        return self.secrets[(namespace, name)]

    async def get_webhook_configuration(
        self, kind: certs.ConfigurationKind, name: str
    ) -> dict[str, Any]:
        try:
            return copy.deepcopy(self.configs[(kind, name)])
        except KeyError:
            raise errors.NotFound(404, "not found") from None

    async def patch_webhook_configuration(
        self, kind: certs.ConfigurationKind, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.configs[(kind, name)] = _apply(self.configs[(kind, name)], ops)
        return self.configs[(kind, name)]


def _settings(tmp_path: Path, name: str = "a", **kw: Any) -> certs.CertSettings:
    return certs.CertSettings(
        cert_dir=tmp_path / name,
        namespace="kserve",
        service_name="hook",
        secret_name="localmodel-webhook-server-cert",
        extra_names=("127.0.0.1",),
        mutating_configurations=("m.x.io",),
        validating_configurations=("v.x.io", "missing.x.io"),
        **kw,
    )


@pytest.fixture
def store() -> FakeStore:
    s = FakeStore()
    s.configs[("mutating", "m.x.io")] = {"webhooks": [{"name": "isvc.x.io", "clientConfig": {}}]}
    s.configs[("validating", "v.x.io")] = {
        "webhooks": [{"name": "lmc.x.io", "clientConfig": {}}, {"name": "lmnc.x.io"}]
    }
    return s


def _ca_bundles(store: FakeStore) -> list[str]:
    return [
        (hook.get("clientConfig") or {}).get("caBundle", "")
        for config in store.configs.values()
        for hook in config["webhooks"]
    ]


async def test_first_start_creates_secret_files_and_ca_bundles(
    store: FakeStore, tmp_path: Path
) -> None:
    changed: list[certgen.CertBundle] = []
    manager = certs.CertManager(
        store, _settings(tmp_path), now=lambda: NOW, on_change=changed.append
    )
    bundle = await manager.ensure()
    assert (
        certgen.bundle_from_secret(store.secrets[("kserve", "localmodel-webhook-server-cert")])
        == bundle
    )
    settings = manager.settings
    assert settings.cert_path.read_bytes() == bundle.cert_pem
    assert settings.ca_path.read_bytes() == bundle.ca_cert_pem
    assert stat.S_IMODE(settings.key_path.stat().st_mode) == 0o600
    assert _ca_bundles(store) == [base64.b64encode(bundle.ca_cert_pem).decode()] * 3
    assert changed == [bundle]


async def test_a_restart_reuses_the_stored_certificate(store: FakeStore, tmp_path: Path) -> None:
    first = await certs.CertManager(store, _settings(tmp_path), now=lambda: NOW).ensure()
    writes = store.writes
    again = await certs.CertManager(store, _settings(tmp_path, "b"), now=lambda: NOW).ensure()
    assert again.serial == first.serial
    assert store.writes == writes


async def test_concurrent_replicas_settle_on_one_certificate(
    store: FakeStore, tmp_path: Path
) -> None:
    managers = [
        certs.CertManager(store, _settings(tmp_path, str(i)), now=lambda: NOW) for i in range(3)
    ]
    bundles = await asyncio.gather(*(m.ensure() for m in managers))
    assert len({b.serial for b in bundles}) == 1
    assert store.writes == 1
    assert len({(tmp_path / str(i) / "tls.crt").read_bytes() for i in range(3)}) == 1


async def test_periodic_check_renews_before_expiry_and_reloads(
    store: FakeStore, tmp_path: Path
) -> None:
    fake = clock.FakeClock()
    now = [NOW]
    changed: list[certgen.CertBundle] = []
    settings = _settings(tmp_path, check_interval_s=60.0)
    manager = certs.CertManager(
        store, settings, clock=fake, now=lambda: now[0], on_change=changed.append
    )
    first = await manager.ensure()
    task = asyncio.create_task(manager.run(), name="cert-check")
    try:
        await fake.advance(60.0)
        assert len(changed) == 1  # still fresh: nothing rewritten
        now[0] = NOW + 340 * DAY
        await fake.advance(60.0)
        for _ in range(20):
            if len(changed) == 2:
                break
            await asyncio.sleep(0)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert len(changed) == 2
    renewed = changed[1]
    assert renewed.serial != first.serial
    assert renewed.ca_cert_pem == first.ca_cert_pem
    assert settings.cert_path.read_bytes() == renewed.cert_pem
    assert certgen.bundle_from_secret(next(iter(store.secrets.values()))) == renewed


async def test_a_replica_adopts_a_renewal_another_replica_stored(
    store: FakeStore, tmp_path: Path
) -> None:
    a = certs.CertManager(store, _settings(tmp_path, "a"), now=lambda: NOW)
    await a.ensure()
    later = NOW + 340 * DAY
    b = certs.CertManager(store, _settings(tmp_path, "b"), now=lambda: later)
    renewed = await b.ensure()
    a.now = lambda: later
    assert (await a.ensure()).serial == renewed.serial
    assert (tmp_path / "a" / "tls.crt").read_bytes() == renewed.cert_pem


async def test_a_reset_ca_bundle_is_patched_again(store: FakeStore, tmp_path: Path) -> None:
    manager = certs.CertManager(store, _settings(tmp_path), now=lambda: NOW)
    bundle = await manager.ensure()
    store.configs[("mutating", "m.x.io")]["webhooks"][0]["clientConfig"] = {}
    await manager.ensure()
    assert _ca_bundles(store)[0] == base64.b64encode(bundle.ca_cert_pem).decode()


async def test_a_cert_manager_secret_is_left_alone(store: FakeStore, tmp_path: Path) -> None:
    bundle = certgen.issue_bundle(NAMES, now=NOW)
    body = certgen.secret_body(bundle, name="localmodel-webhook-server-cert", namespace="kserve")
    body["metadata"]["annotations"] = {
        "cert-manager.io/certificate-name": "localmodel-serving-cert"
    }
    await store.create_secret("kserve", body)
    writes = store.writes
    manager = certs.CertManager(store, _settings(tmp_path), now=lambda: NOW + 400 * DAY)
    with pytest.raises(errors.TerminalError, match="managed by cert-manager"):
        await manager.ensure()
    assert store.writes == writes


async def test_the_secret_name_is_logged_not_redacted(store: FakeStore, tmp_path: Path) -> None:
    """Issue 14: the webhook Secret's *name* was logged as [REDACTED] (key `secret`)."""
    import structlog

    from localcache.runtime import logging as logging_mod

    with structlog.testing.capture_logs() as logs:
        await certs.CertManager(store, _settings(tmp_path), now=lambda: NOW).ensure()
    issued = next(e for e in logs if e["event"] == "certs.issued")
    shown = logging_mod.redact_secrets(None, "info", dict(issued))
    assert _settings(tmp_path).secret_name in shown.values()
