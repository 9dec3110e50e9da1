"""ReloadableTLS: in-memory handshakes against the served certificate, rotation, reload."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from localcache.devenv import certs
from localcache.runtime import clock
from localcache.runtime.serving import tls as tls_mod
from tests.support import tlshandshake


def _handshake_serial(server_ctx: ssl.SSLContext, ca_pem: bytes) -> int:
    """The serial number of the certificate served in an in-memory handshake."""
    client_ctx = ssl.create_default_context(cadata=ca_pem.decode())
    client_ctx.check_hostname = False
    der = tlshandshake.handshake(server_ctx, client_ctx).getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _write_pair(directory: Path, pair: certs.KeyPair) -> None:
    (directory / "tls.crt").write_bytes(pair.cert_pem)
    (directory / "tls.key").write_bytes(pair.key_pem)


def _serial(pair: certs.KeyPair) -> int:
    return x509.load_pem_x509_certificate(pair.cert_pem).serial_number


def test_tls_context_serves_a_rotated_certificate_without_restart(tmp_path: Path) -> None:
    ca = certs.TinyCA("test-ca")
    first, second = ca.serving_cert(["127.0.0.1"]), ca.serving_cert(["127.0.0.1"])
    _write_pair(tmp_path, first)
    tls = tls_mod.ReloadableTLS(tmp_path / "tls.crt", tmp_path / "tls.key")
    assert _handshake_serial(tls.context, ca.cert_pem) == _serial(first)
    assert tls.reload_if_changed() is False
    _write_pair(tmp_path, second)
    assert tls.reload_if_changed() is True
    assert _handshake_serial(tls.context, ca.cert_pem) == _serial(second)


def test_a_failed_reload_keeps_serving_the_previous_certificate(tmp_path: Path) -> None:
    ca = certs.TinyCA("test-ca")
    first, other = ca.serving_cert(["127.0.0.1"]), ca.serving_cert(["127.0.0.1"])
    _write_pair(tmp_path, first)
    tls = tls_mod.ReloadableTLS(tmp_path / "tls.crt", tmp_path / "tls.key")
    (tmp_path / "tls.crt").write_bytes(other.cert_pem)  # key no longer matches
    assert tls.reload_if_changed() is False
    assert _handshake_serial(tls.context, ca.cert_pem) == _serial(first)


async def test_watch_reloads_changed_files_on_its_interval(tmp_path: Path) -> None:
    ca = certs.TinyCA("test-ca")
    first, second = ca.serving_cert(["127.0.0.1"]), ca.serving_cert(["127.0.0.1"])
    _write_pair(tmp_path, first)
    tls = tls_mod.ReloadableTLS(tmp_path / "tls.crt", tmp_path / "tls.key")
    fake = clock.FakeClock()
    task = asyncio.create_task(tls.watch(clock=fake, interval_s=5.0), name="tls-watch")
    try:
        await fake.advance(0)
        _write_pair(tmp_path, second)
        await fake.advance(4.0)
        assert _handshake_serial(tls.context, ca.cert_pem) == _serial(first)
        await fake.advance(1.0)
        assert _handshake_serial(tls.context, ca.cert_pem) == _serial(second)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
