"""A file the peers break off is finished from the origin by Range (`download.peerorigin`),
against real TLS peers and a real HTTP origin on 127.0.0.1.

Matrix: the lone peer goes down mid-file -> the origin sends exactly the rest (one ranged
request at the written offset), verified, and the report counts origin bytes; the origin cut
once is asked again from where it stopped; an origin that ignores Range, sends other bytes, or
is not the file's -> "use origin" and nothing in DEST; no `origin` -> "use origin" as before.
Which URIs an origin is (`api.originpaths.http_origin_path`): the storage initializer's file name,
never an archive, a compressed file, credentials in the URI or another scheme.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from localcache.api import originpaths
from localcache.download import peerfetch, peerorigin, peersources
from tests.support import peerwire
from tests.support.peerwire import HttpOrigin, Peer

DATA = os.urandom(2 * 1024 * 1024 + 3)
FILES = {"model.bin": DATA}
MANIFEST = peerwire.manifest_for(FILES)
CUT = 700_000


class NoWaitClock:
    def now(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)


async def _fetch(
    source: Peer, origin: peerorigin.Origin | None, dest: Path, tls: peerwire.Tls, token: Path
) -> peersources.Board:
    request = peerwire.fetch_request(
        tls, token, digest=MANIFEST.digest, clock=NoWaitClock(), origin=origin
    )
    board = peersources.Board([peersources.parse_source(source.source)])
    await peerfetch.fetch(request, dest, board)
    return board


@pytest.fixture
async def dying_peer(tls: peerwire.Tls) -> AsyncIterator[Peer]:
    """A lone peer that goes down (502 on) after sending `CUT` bytes of the file."""
    faults = peerwire.Faults(cut_at={"model.bin": CUT}, status_after_cut=502)
    async with Peer("node-a", FILES, tls, manifest=MANIFEST, faults=faults).running() as p:
        yield p


async def test_a_file_the_lone_peer_breaks_off_is_finished_from_the_origin_by_range(
    dying_peer: Peer, tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    async with HttpOrigin(DATA).running() as origin:
        dest = tmp_path / "dest"
        board = await _fetch(dying_peer, peerorigin.Origin.of(origin.url), dest, tls, token_file)

        assert (dest / "model.bin").read_bytes() == DATA
        assert len(origin.ranges) == 1, origin.ranges
        offset = int(str(origin.ranges[0]).removeprefix("bytes=").removesuffix("-"))
        assert 0 < offset <= CUT, "resumed where the peer stopped, not from byte 0"
        assert board.bytes["node-a"] == offset
        assert board.origin_bytes == len(DATA) - offset


async def test_an_origin_cut_once_is_asked_again_from_where_it_stopped(
    dying_peer: Peer, tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    async with HttpOrigin(DATA, cut_first_at=1_500_000).running() as origin:
        dest = tmp_path / "dest"
        board = await _fetch(dying_peer, peerorigin.Origin.of(origin.url), dest, tls, token_file)

        assert (dest / "model.bin").read_bytes() == DATA
        starts = [int(str(r).removeprefix("bytes=").removesuffix("-")) for r in origin.ranges]
        assert len(starts) == 2, origin.ranges
        assert 0 < starts[0] < starts[1] <= 1_500_000, origin.ranges
        assert board.bytes["node-a"] + board.origin_bytes == len(DATA)


@pytest.mark.parametrize(
    ("origin", "why"),
    [
        (HttpOrigin(DATA, ignore_range=True), "HTTP 200 (expected 206)"),
        (HttpOrigin(os.urandom(len(DATA))), "the origin's bytes fail the manifest's sha256"),
        (HttpOrigin(DATA, statuses=[404]), "HTTP 404 (expected 206)"),
        (HttpOrigin(DATA, statuses=[503, 502, 500]), "broke off 3 times (HTTP 500)"),
        (HttpOrigin(DATA, headers={"Content-Encoding": "gzip"}), "an encoded body"),
        (HttpOrigin(DATA, headers={"Content-Range": "bytes 1-9/10"}), "Content-Range"),
        (HttpOrigin(DATA, extra=b"more"), "more bytes than the file's size"),
        (HttpOrigin(DATA, redirect="http://[zz/x"), "refused: no URL"),
        (HttpOrigin(DATA, redirect="ftp://elsewhere/model.bin"), "not an http(s) URL"),
    ],
    ids=[
        "ignores-range", "other-bytes", "404", "5xx-thrice", "encoded", "other-range",
        "excess", "bad-redirect", "ftp-redirect",
    ],
)  # fmt: skip
async def test_an_origin_that_cannot_finish_the_file_means_use_origin_and_nothing_lands(
    dying_peer: Peer,
    origin: HttpOrigin,
    why: str,
    tls: peerwire.Tls,
    token_file: Path,
    tmp_path: Path,
) -> None:
    async with origin.running():
        dest = tmp_path / "dest"
        with pytest.raises(peersources.FetchError) as caught:
            await _fetch(dying_peer, peerorigin.Origin.of(origin.url), dest, tls, token_file)

        assert caught.value.use_origin
        assert why in str(caught.value)
        assert "no peer could serve 'model.bin'" in str(caught.value)
        assert not dest.exists()


async def test_without_an_origin_or_for_another_file_the_run_ends_with_use_origin(
    dying_peer: Peer, tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    async with HttpOrigin(DATA).running() as origin:
        other = peerorigin.Origin(url=origin.url, path="other.bin")
        for given in (None, other):
            dying_peer.faults.cut_at["model.bin"] = CUT
            dying_peer.faults.status = None
            with pytest.raises(peersources.FetchError) as caught:
                await _fetch(dying_peer, given, tmp_path / "dest", tls, token_file)
            assert caught.value.use_origin
            assert "the origin" not in str(caught.value)
        assert origin.ranges == [], "the origin was never asked"


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("https://host.example/models/model.bin", "model.bin"),
        ("http://10.0.0.1:8080/a/b/weights.safetensors?sig=1", "weights.safetensors"),
        ("https://host.example/m/model%20one.bin", "model%20one.bin"),
    ],
)
def test_an_http_origin_names_the_file_as_the_storage_initializer_does(uri: str, path: str) -> None:
    assert originpaths.http_origin_path(uri) == path
    assert peerorigin.Origin.of(uri) == peerorigin.Origin(url=uri, path=path)


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("s3://bucket/model.bin", "not an http"),
        ("gs://bucket/model.bin", "not an http"),
        ("https://host.example/model.tar", "archive"),
        ("https://host.example/model.tar.gz", "archive"),
        ("https://host.example/model.zip", "archive"),
        ("https://host.example/model.bin.gz", "compressed"),
        ("https://host.example/download?file=model.tgz", "archive"),
        ("https://user:secret@host.example/model.bin", "credentials"),
        ("https://host.example/", "unsafe manifest path"),
        ("https://host.example/a/..", "unsafe manifest path"),
        ("https://host.example/model\x00.bin", "printable"),
    ],
)
def test_uris_whose_stored_bytes_are_not_the_origins_are_no_origin(uri: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        originpaths.http_origin_path(uri)


async def test_an_origin_busy_once_is_asked_again_at_the_same_offset(
    dying_peer: Peer, tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    async with HttpOrigin(DATA, statuses=[503]).running() as origin:
        dest = tmp_path / "dest"
        board = await _fetch(dying_peer, peerorigin.Origin.of(origin.url), dest, tls, token_file)

        assert (dest / "model.bin").read_bytes() == DATA
        assert len(origin.ranges) == 2, origin.ranges
        assert origin.ranges[0] == origin.ranges[1], "the same offset again"
        assert board.bytes["node-a"] + board.origin_bytes == len(DATA)


async def test_bad_peer_bytes_under_the_origins_rest_cost_the_file_once_more_and_name_the_peer(
    tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    bad = bytes([DATA[0] ^ 0x01]) + DATA[1:]  # the manifest is DATA's: the peer's copy is not
    faults = peerwire.Faults(cut_at={"model.bin": CUT}, status_after_cut=502)
    peer_ = Peer("node-a", {"model.bin": bad}, tls, manifest=MANIFEST, faults=faults)
    async with peer_.running(), HttpOrigin(DATA).running() as origin:
        dest = tmp_path / "dest"
        board = await _fetch(peer_, peerorigin.Origin.of(origin.url), dest, tls, token_file)

        assert (dest / "model.bin").read_bytes() == DATA
        assert origin.ranges[1:] == [None], "then the whole file, once"
        assert list(board.corrupt) == ["node-a"], "named as a bad source in the report"
        assert "sha256" in board.corrupt["node-a"]


async def test_nothing_is_asked_of_the_origin_when_nothing_is_left() -> None:
    writes: list[bytes] = []
    got = await peerorigin.finish(
        peerorigin.Origin("http://127.0.0.1:9/models/model.bin", "model.bin"), "model.bin",
        offset=10, size=10, write=writes.append, connect_timeout=1.0, io_timeout=1.0,
        clock=NoWaitClock(),
    )  # fmt: skip
    assert (got, writes) == (0, [])
