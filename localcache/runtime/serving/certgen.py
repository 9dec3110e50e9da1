"""Pure certificate logic for self-managed serving certificates (the admission server's, the
peer data plane's).

No I/O and no clock: every function takes `now`. `runtime.serving.certs.CertManager` does the I/O.
- `service_dns_names`: the names a client may use for a Service.
- `issue_bundle`: a CA and a serving certificate it signed (`CertBundle`, all PEM).
- `renewal_reason`: why a stored bundle must be replaced, or None.
- `bundle_from_secret` / `secret_body`: a bundle from / as a `kubernetes.io/tls` Secret.
- `ca_bundle_patch`: JSON-patch ops putting a CA into a webhook configuration's `caBundle`.

Contract:
- The CA of a previous bundle is kept across serving-certificate renewals while it stays valid
  long enough; when it is itself renewed, the previous CA stays in `ca_cert_pem` (the trust
  bundle) until it expires, so a client holding either CA trusts the new certificate.
- Not promised: stable serial numbers or key material (every issue makes fresh keys).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Keys of the Secret's `data`, and the file names in the certificate directory.
CA_CERT_KEY = "ca.crt"
CA_KEY_KEY = "ca.key"
TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"


@dataclass(frozen=True)
class CertBundle:
    """A CA (key + trust bundle) and a serving certificate it signed, all PEM.

    `ca_cert_pem` is the trust bundle: the current CA first, then a previous CA that has not
    expired yet (during a CA rotation). `ca_key_pem` is the current CA's key.
    """

    ca_cert_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def serial(self) -> int:
        return self.certificate.serial_number

    @property
    def not_after(self) -> datetime.datetime:
        return self.certificate.not_valid_after_utc


def service_dns_names(
    service: str, namespace: str, *, cluster_domain: str = "cluster.local"
) -> list[str]:
    """The names a client may use for a Service: `svc`, `svc.ns`, `svc.ns.svc`, and the FQDN."""
    svc = f"{service}.{namespace}.svc"
    return [service, f"{service}.{namespace}", svc, f"{svc}.{cluster_domain}"]


_CA_USAGE = x509.KeyUsage(
    digital_signature=True, content_commitment=False, key_encipherment=False,
    data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
    encipher_only=False, decipher_only=False,
)  # fmt: skip


_DER, _SPKI = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo


def _spki(key: Any) -> bytes:
    return bytes(key.public_bytes(_DER, _SPKI))


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _sign(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    *,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    now: datetime.datetime,
    not_after: datetime.datetime,
    extensions: list[tuple[x509.ExtensionType, bool]],
) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer or (name, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after)
    )
    for ext, critical in extensions:
        builder = builder.add_extension(ext, critical=critical)
    return builder.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def issue_bundle(
    names: Sequence[str],
    *,
    now: datetime.datetime,
    cert_validity: datetime.timedelta = datetime.timedelta(days=365),
    ca_validity: datetime.timedelta = datetime.timedelta(days=3650),
    previous: CertBundle | None = None,
    ca_name: str = "localcache-webhook-ca",
) -> CertBundle:
    """A serving certificate for `names` (IP literals become IP SANs), signed by a CA (a new
    one's common name is `ca_name@<unix time>`).

    The CA of `previous` is reused when it outlives the new certificate by a day; otherwise a
    new CA is made and `previous`'s current CA stays in the trust bundle while still valid.
    """
    if not names:
        raise ValueError("a serving certificate needs at least one name")
    trust_extra = b""
    if previous is not None and _ca_reusable(previous, now=now, until=now + cert_validity):
        ca_cert_pem, ca_key_pem = _first_pem(previous.ca_cert_pem), previous.ca_key_pem
    else:
        new_key = ec.generate_private_key(ec.SECP256R1())
        ski = x509.SubjectKeyIdentifier.from_public_key(new_key.public_key())
        ca_cert_pem = _sign(
            f"{ca_name}@{int(now.timestamp())}",
            new_key,
            issuer=None,
            now=now,
            not_after=now + ca_validity,
            extensions=[
                (x509.BasicConstraints(ca=True, path_length=0), True),
                (_CA_USAGE, True),
                (ski, False),
            ],
        )
        ca_key_pem = _key_pem(new_key)
        if previous is not None:
            old = _safe_certs(previous.ca_cert_pem)[:1]
            trust_extra = b"".join(_pem(c) for c in old if c.not_valid_after_utc > now)
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    cert_pem = _sign(
        names[0],
        key,
        issuer=(ca_cert.subject, ca_key),
        now=now,
        not_after=min(now + cert_validity, ca_cert.not_valid_after_utc),
        extensions=[
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
            (x509.SubjectAlternativeName(_general_names(names)), False),
        ],
    )
    return CertBundle(ca_cert_pem + trust_extra, ca_key_pem, cert_pem, _key_pem(key))


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _first_pem(pem: bytes) -> bytes:
    return _pem(x509.load_pem_x509_certificates(pem)[0])


def _general_names(names: Sequence[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def _safe_certs(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def _ca_reusable(bundle: CertBundle, *, now: datetime.datetime, until: datetime.datetime) -> bool:
    cas = _safe_certs(bundle.ca_cert_pem)
    if not cas:
        return False
    try:
        key = serialization.load_pem_private_key(bundle.ca_key_pem, password=None)
    except ValueError:
        return False
    ca = cas[0]
    return (
        _spki(key.public_key()) == _spki(ca.public_key())
        and ca.not_valid_before_utc <= now
        and ca.not_valid_after_utc >= until + datetime.timedelta(days=1)
    )


def renewal_reason(
    bundle: CertBundle | None,
    *,
    names: Sequence[str],
    now: datetime.datetime,
    renew_before: datetime.timedelta,
) -> str | None:
    """Why `bundle` must be replaced (a short sentence), or None when it can be served as is."""
    if bundle is None:
        return "no certificate stored"
    try:
        cert = bundle.certificate
        serving_key = serialization.load_pem_private_key(bundle.key_pem, password=None)
    except ValueError:
        return "stored certificate or key does not parse"
    cas = _safe_certs(bundle.ca_cert_pem)
    if not cas:
        return "stored CA does not parse"
    if _spki(serving_key.public_key()) != _spki(cert.public_key()):
        return "stored key does not match the certificate"
    if not any(_signed_by(cert, ca) for ca in cas):
        return "certificate is not signed by the stored CA"
    if cert.not_valid_before_utc > now:
        return "certificate is not valid yet"
    if cert.not_valid_after_utc - now <= renew_before:
        return "certificate expires within the renewal threshold"
    if cas[0].not_valid_after_utc - now <= renew_before:
        return "CA expires within the renewal threshold"
    missing = set(names) - set(_san_strings(cert))
    if missing:
        return "certificate lacks names: " + ", ".join(sorted(missing))
    return None


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _san_strings(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    dns = san.get_values_for_type(x509.DNSName)
    ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    return [*dns, *ips]


def bundle_from_secret(secret: dict[str, Any]) -> CertBundle | None:
    """The bundle stored in a Secret's `data`, or None when a key is missing or not base64."""
    data = secret.get("data") or {}
    try:
        parts = [
            base64.b64decode(data[k], validate=True)
            for k in (CA_CERT_KEY, CA_KEY_KEY, TLS_CERT_KEY, TLS_KEY_KEY)
        ]
    except (KeyError, ValueError, TypeError):
        return None
    return CertBundle(*parts)


def secret_body(
    bundle: CertBundle,
    *,
    name: str,
    namespace: str,
    resource_version: str | None = None,
    component: str = "webhook",
) -> dict[str, Any]:
    """The Secret (type kubernetes.io/tls, plus `ca.crt` and `ca.key`) that stores `bundle`,
    labelled managed-by localcache and `app.kubernetes.io/component: <component>`."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {
            "app.kubernetes.io/managed-by": "localcache",
            "app.kubernetes.io/component": component,
        },
    }
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "kubernetes.io/tls",
        "data": {
            CA_CERT_KEY: _b64(bundle.ca_cert_pem),
            CA_KEY_KEY: _b64(bundle.ca_key_pem),
            TLS_CERT_KEY: _b64(bundle.cert_pem),
            TLS_KEY_KEY: _b64(bundle.key_pem),
        },
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def ca_bundle_patch(configuration: dict[str, Any], ca_pem: bytes) -> list[dict[str, Any]]:
    """JSON-patch ops setting `clientConfig.caBundle` on every webhook entry that differs.

    Each `add` is guarded by a `test` of the entry's name, so a concurrent reordering of the
    list makes the patch fail instead of writing to the wrong entry. Empty when nothing differs.
    """
    wanted = _b64(ca_pem)
    ops: list[dict[str, Any]] = []
    for i, hook in enumerate(configuration.get("webhooks") or []):
        client = hook.get("clientConfig") or {}
        if client.get("caBundle") == wanted:
            continue
        ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")})
        if "clientConfig" not in hook:
            ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig", "value": {}})
        ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": wanted})
    return ops
