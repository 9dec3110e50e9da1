"""Fixtures shared by the peer fetcher's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcache.api import peer
from tests.support import peerwire


@pytest.fixture
def tls(tmp_path: Path) -> peerwire.Tls:
    """A CA and a server certificate for `peer.SERVER_NAME`."""
    return peerwire.tls_material(tmp_path, [peer.SERVER_NAME])


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    """The projected token's file, as the kubelet writes it (the fetcher re-reads it)."""
    path = tmp_path / "token"
    path.write_text("token-one\n")
    return path
