"""What `localcache fetch`'s engine refuses: every refusal is "use origin" (exit 3) and
leaves nothing in DEST (a DEST the run created is removed again, an older entry is kept).

Matrix: a manifest whose stated or computed digest is not the one asked for, of another
storage key, with a traversing path, a link out of the folder (lexically or through another
link), a special file, more bytes than --max-size; a peer whose certificate names another
host or comes from another CA; a peer answering 404; no peer listening at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
from pathlib import Path

import pydantic
import pytest

from localcache.api import peer
from localcache.download import peerfetch, peersources
from tests.support import peerwire
from tests.support.peerwire import Faults, Peer


class NoWait:
    """A clock whose sleeps return at once (backoff is tested in test_peerfetch)."""

    def now(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)


FILES = {"config.json": b"{}", "weights/model.bin": b"w" * 5000}
MANIFEST = peerwire.manifest_for(FILES, dirs=["weights"])


def _request(
    ca_pem: str, token_file: Path, *, digest: str = MANIFEST.digest, max_bytes: int = 1 << 30
) -> peerfetch.Request:
    return peerfetch.Request(
        storage_key=peerwire.KEY,
        digest=digest,
        credentials=peersources.Credentials(ca_pem=ca_pem, token_file=token_file),
        max_bytes=max_bytes,
        deadline=30.0,
        stall_timeout=2.0,
        connect_timeout=2.0,
        clock=NoWait(),
    )


async def _refused(
    peers: list[Peer], dest: Path, request: peerfetch.Request
) -> peersources.FetchError:
    board = peersources.Board([peersources.parse_source(p.source) for p in peers])
    with pytest.raises(peersources.FetchError) as caught:
        await peerfetch.fetch(request, dest, board)
    assert caught.value.use_origin, str(caught.value)
    return caught.value


async def _refused_manifest(
    manifest: peer.PeerManifest | bytes, tls: peerwire.Tls, token_file: Path, dest: Path
) -> str:
    if isinstance(manifest, bytes):
        peer_ = Peer("node-a", FILES, tls, faults=Faults(manifest_body=manifest))
        digest = MANIFEST.digest
    else:
        peer_ = Peer("node-a", FILES, tls, manifest=manifest)
        digest = manifest.digest
    async with peer_.running():
        error = await _refused([peer_], dest, _request(tls.ca_pem, token_file, digest=digest))
    assert [r.path for r in peer_.requests if r.path != "manifest"] == []
    return str(error)


async def test_a_manifest_of_another_digest_is_refused(
    tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    other = peerwire.manifest_for({"config.json": b"other"})
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "config.json").write_bytes(b"older")
    peer_ = Peer("node-a", FILES, tls, manifest=other)
    async with peer_.running():
        error = await _refused([peer_], dest, _request(tls.ca_pem, token_file))
    assert "digest" in str(error)
    assert sorted(p.name for p in dest.iterdir()) == ["config.json"]
    assert (dest / "config.json").read_bytes() == b"older"


async def test_a_manifest_whose_listing_does_not_match_its_digest_is_refused(
    tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    forged = MANIFEST.model_dump(by_alias=True)
    forged["files"][0]["sha256"] = hashlib.sha256(b"evil").hexdigest()  # digest kept
    error = await _refused_manifest(json.dumps(forged).encode(), tls, token_file, tmp_path / "dest")
    assert "digest" in error
    assert not (tmp_path / "dest").exists()


async def test_a_manifest_with_a_traversing_path_is_refused(
    tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    evil = MANIFEST.model_dump(by_alias=True)
    evil["files"][0]["path"] = "../../etc/cron.d/evil"
    with pytest.raises(pydantic.ValidationError, match="unsafe manifest path"):
        peer.PeerManifest.model_validate(evil)
    error = await _refused_manifest(json.dumps(evil).encode(), tls, token_file, tmp_path / "d")
    assert "invalid manifest" in error
    assert not (tmp_path / "d").exists()


async def test_a_manifest_of_another_storage_key_is_refused(
    tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    other = MANIFEST.model_dump(by_alias=True)
    other["storageKey"] = "fedcba9876543210"
    error = await _refused_manifest(json.dumps(other).encode(), tls, token_file, tmp_path / "d")
    assert "storage key" in error


@pytest.mark.parametrize(
    ("links", "dirs"),
    [
        ({"latest": "../../etc/passwd"}, []),
        ({"latest": "/etc/passwd"}, []),
        ({"weights/up": "../.."}, []),
        # Lexically inside, but d/l2 is the folder itself, so d/l1 = the folder's parent.
        ({"d/l2": "..", "d/l1": "l2/.."}, ["d"]),
    ],
)
async def test_a_link_leading_out_of_the_folder_is_refused(
    links: dict[str, str], dirs: list[str], tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    manifest = peerwire.manifest_for(FILES, dirs=["weights", *dirs], links=links)
    peer_ = Peer("node-a", FILES, tls, manifest=manifest)
    dest = tmp_path / "dest"
    async with peer_.running():
        request = _request(tls.ca_pem, token_file, digest=manifest.digest)
        error = await _refused([peer_], dest, request)
    assert "outside the model" in str(error)
    assert not dest.exists()


async def test_a_special_file_in_the_manifest_means_use_origin(
    tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    manifest = peerwire.manifest_for(FILES, dirs=["weights"], others=["weights/fifo"])
    error = await _refused_manifest(manifest, tls, token_file, tmp_path / "dest")
    assert "special file" in error


async def test_a_model_over_the_max_size_is_refused_before_any_file(
    tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    peer_ = Peer("node-a", FILES, tls, manifest=MANIFEST)
    async with peer_.running():
        request = _request(tls.ca_pem, token_file, max_bytes=1000)
        error = await _refused([peer_], tmp_path / "dest", request)
    assert "--max-size" in str(error)
    assert [r.path for r in peer_.requests] == ["manifest"]


@pytest.mark.parametrize("case", ["wrong-name", "untrusted-ca"])
async def test_a_peer_with_a_certificate_we_do_not_trust_is_refused(
    case: str, tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    if case == "wrong-name":
        server = peerwire.tls_material(tmp_path, ["node-a.example"])
        trusted = server.ca_pem
    else:
        server = peerwire.tls_material(tmp_path, [peer.SERVER_NAME])
        trusted = tls.ca_pem  # another CA
    peer_ = Peer("node-a", FILES, server, manifest=MANIFEST)
    async with peer_.running():
        error = await _refused([peer_], tmp_path / "dest", _request(trusted, token_file))
    assert "TLS" in str(error)
    assert peer_.requests == []
    assert not (tmp_path / "dest").exists()


async def test_a_peer_answering_404_is_left_for_the_origin(
    tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    peer_ = Peer("node-a", FILES, tls, manifest=MANIFEST, faults=Faults(status=404))
    async with peer_.running():
        error = await _refused([peer_], tmp_path / "dest", _request(tls.ca_pem, token_file))
    assert "HTTP 404" in str(error)


async def test_no_peer_listening_means_use_origin(
    tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    board = peersources.Board([peersources.parse_source(f"node-a=https://127.0.0.1:{port}")])
    with pytest.raises(peersources.FetchError) as caught:
        await peerfetch.fetch(_request(tls.ca_pem, token_file), tmp_path / "dest", board)
    assert caught.value.use_origin
    assert "no peer served the manifest" in str(caught.value)
    assert not (tmp_path / "dest").exists()
