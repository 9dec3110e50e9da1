"""`--tls-min-version` and `--tls-cipher-suites` (KServe #5791's flags, Go's names): what they
accept, and what the admission server's context then negotiates, in memory handshakes."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import pytest

from localcache import settings
from localcache.devenv import certs
from localcache.runtime.serving import tls as tls_mod
from localcache.runtime.serving import tlsoptions
from tests.support import tlshandshake


def _handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> tuple[str, str]:
    """(TLS version, cipher) of an in-memory handshake; the SSLError of a refused one."""
    client = tlshandshake.handshake(server_ctx, client_ctx)
    cipher = client.cipher()
    assert cipher is not None
    return str(client.version()), cipher[0]


@pytest.fixture
def served(tmp_path: Path) -> tuple[Path, Path, bytes]:
    ca = certs.TinyCA("test-ca")
    pair = ca.serving_cert(["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    return tmp_path / "tls.crt", tmp_path / "tls.key", ca.cert_pem


def _client(
    ca_pem: bytes, *, max_version: ssl.TLSVersion, ciphers: str | None = None
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    ctx.check_hostname = False
    ctx.maximum_version = max_version
    if ciphers:
        ctx.set_ciphers(ciphers)
    return ctx


def test_the_default_is_tls12_with_ecdhe_aead_only(served: tuple[Path, Path, bytes]) -> None:
    cert, key, ca = served
    server = tls_mod.ReloadableTLS(cert, key, tlsoptions.resolve("", "")).context
    version, cipher = _handshake(server, _client(ca, max_version=ssl.TLSVersion.TLSv1_2))
    assert (version, cipher.startswith("ECDHE-")) == ("TLSv1.2", True)
    assert "GCM" in cipher or "CHACHA20" in cipher
    cbc_only = _client(ca, max_version=ssl.TLSVersion.TLSv1_2, ciphers="ECDHE-ECDSA-AES128-SHA")
    with pytest.raises(ssl.SSLError):
        _handshake(server, cbc_only)


def test_tls13_as_the_minimum_refuses_a_tls12_client(served: tuple[Path, Path, bytes]) -> None:
    cert, key, ca = served
    server = tls_mod.ReloadableTLS(cert, key, tlsoptions.resolve("VersionTLS13", "")).context
    with pytest.raises(ssl.SSLError):
        _handshake(server, _client(ca, max_version=ssl.TLSVersion.TLSv1_2))
    assert _handshake(server, _client(ca, max_version=ssl.TLSVersion.TLSv1_3))[0] == "TLSv1.3"


def test_named_suites_are_the_only_tls12_ones_served(served: tuple[Path, Path, bytes]) -> None:
    cert, key, ca = served
    options = tlsoptions.resolve("VersionTLS12", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384")
    server = tls_mod.ReloadableTLS(cert, key, options).context
    tls12 = _client(ca, max_version=ssl.TLSVersion.TLSv1_2)
    assert _handshake(server, tls12) == ("TLSv1.2", "ECDHE-ECDSA-AES256-GCM-SHA384")
    other = _client(ca, max_version=ssl.TLSVersion.TLSv1_2, ciphers="ECDHE-ECDSA-AES128-GCM-SHA256")
    with pytest.raises(ssl.SSLError):
        _handshake(server, other)


@pytest.mark.parametrize(
    ("version", "suites", "message"),
    [
        ("VersionTLS11", "", "unknown TLS version 'VersionTLS11'"),
        ("1.2", "", "unknown TLS version '1.2'"),
        ("", "TLS_RSA_WITH_RC4_128_SHA", "unknown cipher suites TLS_RSA_WITH_RC4_128_SHA"),
        ("", "TLS_AES_128_GCM_SHA256", "only TLS 1.3 suites named"),
    ],
)
def test_what_the_flags_do_not_know_is_a_settings_error_naming_them(
    version: str, suites: str, message: str
) -> None:
    args = argparse.Namespace(tls_min_version=version or None, tls_cipher_suites=suites or None)
    with pytest.raises(
        settings.SettingsError, match="--tls-min-version / --tls-cipher-suites: " + message
    ):
        settings.from_args(args, "controller", environ={})


def test_go_aliases_and_tls13_names_are_accepted() -> None:
    options = tlsoptions.resolve(
        "VersionTLS12", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305, TLS_AES_128_GCM_SHA256"
    )
    assert options.suites == ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",)
    assert tlsoptions.resolve("VersionTLS13", "TLS_AES_128_GCM_SHA256").suites
