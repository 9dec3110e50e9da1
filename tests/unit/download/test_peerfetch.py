"""`localcache fetch`'s engine against real TLS peers on 127.0.0.1 (`tests.support.peerwire`).

Matrix: a model is fetched from the best peer, verified and committed (dirs, links, empty
files), with the bearer token re-read per request and at most `concurrency` files in flight;
a cut or stalled stream resumes by Range at the written offset from the next peer (nothing
restarts at byte 0); a peer serving a flipped byte is banned and the file refetched whole
from another, never committed corrupted; 429 moves on to the next peer, and a lone busy peer
is waited for (Retry-After); a manifest with a wrong digest, a traversing path, a link out of
the folder, a special file, or too many bytes is refused; a wrong certificate name or an
untrusted CA is refused. Every refusal ends in "use origin" and leaves nothing in DEST.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from localcache.download import peerfetch, peersources
from tests.support import peerwire
from tests.support.peerwire import Faults, Peer

BIG = os.urandom(3 * 1024 * 1024 + 5)
FILES = {
    "config.json": b'{"a": 1}',
    "weights/model.bin": BIG,
    "weights/empty.bin": b"",
    "tokenizer/vocab.txt": os.urandom(70_000),
}
MANIFEST = peerwire.manifest_for(
    FILES, dirs=["weights", "tokenizer", "extra/empty"], links={"latest": "weights/model.bin"}
)


class RecordingClock:
    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def now(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(0)


Run = Callable[..., "asyncio.Future[int]"]


def _request(
    tls: peerwire.Tls, token_file: Path, clock: RecordingClock, **overrides: object
) -> peerfetch.Request:
    fields: dict[str, object] = {"concurrency": 2, **overrides}
    return peerwire.fetch_request(tls, token_file, digest=MANIFEST.digest, clock=clock, **fields)


async def _fetch(
    peers: list[Peer], dest: Path, request: peerfetch.Request
) -> tuple[int, peersources.Board]:
    board = peersources.Board([peersources.parse_source(p.source) for p in peers])
    return await peerfetch.fetch(request, dest, board), board


def _tree(root: Path) -> dict[str, bytes | str | None]:
    """Every entry under `root`: file bytes, link target, or None for a directory."""
    out: dict[str, bytes | str | None] = {}
    for current, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(current) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = os.readlink(path)
            elif path.is_dir():
                out[rel] = None
            else:
                out[rel] = path.read_bytes()
    return out


EXPECTED = {
    "config.json": FILES["config.json"],
    "weights": None,
    "weights/model.bin": BIG,
    "weights/empty.bin": b"",
    "tokenizer": None,
    "tokenizer/vocab.txt": FILES["tokenizer/vocab.txt"],
    "extra": None,
    "extra/empty": None,
    "latest": "weights/model.bin",
}


@pytest.fixture
async def pair(tls: peerwire.Tls) -> AsyncIterator[tuple[Peer, Peer]]:
    first = Peer("node-a", FILES, tls, manifest=MANIFEST)
    second = Peer("node-b", FILES, tls, manifest=MANIFEST)
    async with first.running(), second.running():
        yield first, second


async def test_a_model_is_fetched_verified_and_committed_from_the_best_peer(
    pair: tuple[Peer, Peer], tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    first, second = pair
    dest = tmp_path / "dest"
    (dest / "config.json").parent.mkdir()
    (dest / "config.json").write_bytes(b"old")

    def rotate() -> None:  # the kubelet rotates the token between two requests
        token_file.write_text("token-two")

    first.on_manifest = rotate
    clock = RecordingClock()
    size, board = await _fetch([first, second], dest, _request(tls, token_file, clock))

    assert size == MANIFEST.bytes
    assert _tree(dest) == EXPECTED
    assert second.requests == []
    assert board.bytes == {"node-a": MANIFEST.bytes, "node-b": 0}
    assert first.requests[0].token == "Bearer token-one"
    assert {r.token for r in first.requests[1:]} == {"Bearer token-two"}
    assert {r.path for r in first.requests} == {"manifest", *FILES} - {"weights/empty.bin"}
    assert first.max_in_flight <= 2
    assert clock.sleeps == []


async def test_a_cut_stream_resumes_by_range_from_the_next_peer(
    pair: tuple[Peer, Peer], tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    first, second = pair
    first.faults.cut_at["weights/model.bin"] = 1_000_000
    dest = tmp_path / "dest"
    _, board = await _fetch([first, second], dest, _request(tls, token_file, RecordingClock()))

    assert _tree(dest) == EXPECTED
    assert [r.range for r in first.file_requests("weights/model.bin")] == [None]
    resumed = second.file_requests("weights/model.bin")
    assert len(resumed) == 1
    written = int(resumed[0].range.removeprefix("bytes=").removesuffix("-"))  # type: ignore[union-attr]
    assert 0 < written <= 1_000_000
    assert board.bytes["node-b"] == len(BIG) - written
    assert board.bytes["node-a"] == MANIFEST.bytes - len(BIG) + written


async def test_a_stalled_stream_resumes_by_range_from_the_next_peer(
    pair: tuple[Peer, Peer], tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    first, second = pair
    first.faults.stall_at["weights/model.bin"] = 500_000
    dest = tmp_path / "dest"
    await _fetch([first, second], dest, _request(tls, token_file, RecordingClock()))

    assert _tree(dest) == EXPECTED
    ranges = [r.range for r in second.file_requests("weights/model.bin")]
    assert len(ranges) == 1
    assert ranges[0] is not None
    assert ranges[0] != "bytes=0-"


async def test_a_flipped_byte_bans_the_peer_and_the_file_is_refetched_whole(
    pair: tuple[Peer, Peer], tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    first, second = pair
    first.faults.flip.add("config.json")  # the first file fetched
    dest = tmp_path / "dest"
    request = _request(tls, token_file, RecordingClock(), concurrency=1)
    _, board = await _fetch([first, second], dest, request)

    assert _tree(dest) == EXPECTED
    assert [r.range for r in second.file_requests("config.json")] == [None]
    # Banned: after the bad file, node-a is asked nothing more; node-b serves the rest.
    assert [r.path for r in first.requests] == ["manifest", "config.json"]
    assert {r.path for r in second.requests} == set(FILES) - {"weights/empty.bin"}
    assert "sha256" in board.why_banned()
    assert list(board.corrupt) == ["node-a"], "named as a bad source in the report"


async def test_a_lone_peer_serving_bad_bytes_means_use_origin_and_nothing_lands(
    tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    bad = Peer("node-a", FILES, tls, manifest=MANIFEST, faults=Faults(flip={"config.json"}))
    async with bad.running():
        with pytest.raises(peersources.FetchError, match="sha256") as caught:
            await _fetch([bad], dest, _request(tls, token_file, RecordingClock()))
    assert caught.value.use_origin
    assert not dest.exists()


async def test_429_moves_on_to_the_next_peer_without_waiting(
    pair: tuple[Peer, Peer], tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    first, second = pair
    first.faults.busy = 1000
    clock = RecordingClock()
    dest = tmp_path / "dest"
    _, board = await _fetch([first, second], dest, _request(tls, token_file, clock))

    assert _tree(dest) == EXPECTED
    assert board.bytes["node-a"] == 0
    assert clock.sleeps == []


async def test_a_lone_busy_peer_is_waited_for_as_retry_after_says(
    tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    busy = Peer("node-a", FILES, tls, manifest=MANIFEST, faults=Faults(busy=1))
    clock = RecordingClock()
    async with busy.running():
        await _fetch([busy], tmp_path / "dest", _request(tls, token_file, clock, concurrency=1))
    assert _tree(tmp_path / "dest") == EXPECTED
    assert clock.sleeps == [7.0]


async def test_a_peer_sending_more_than_the_manifest_size_is_banned(
    pair: tuple[Peer, Peer], tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    first, second = pair
    first.files = {**FILES, "config.json": FILES["config.json"] + b"extra"}
    dest = tmp_path / "dest"
    _, board = await _fetch([first, second], dest, _request(tls, token_file, RecordingClock()))
    assert _tree(dest) == EXPECTED
    assert "Content-Length" in board.why_banned()


async def test_a_ranged_answer_starting_elsewhere_bans_the_peer(
    tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    faults = [
        Faults(cut_at={"weights/model.bin": 100_000}),
        Faults(shifted_range={"weights/model.bin"}),
    ]
    peers = [
        Peer(f"node-{c}", FILES, tls, manifest=MANIFEST, faults=f)
        for c, f in zip("abc", [*faults, Faults()], strict=True)
    ]
    async with peers[0].running(), peers[1].running(), peers[2].running():
        _, board = await _fetch(
            peers, tmp_path / "dest", _request(tls, token_file, RecordingClock())
        )
    assert _tree(tmp_path / "dest") == EXPECTED
    assert "Content-Range" in board.why_banned()
    resumed = peers[2].file_requests("weights/model.bin")
    assert [r.range for r in resumed] == [peers[1].file_requests("weights/model.bin")[0].range]


async def test_a_forged_manifest_bans_its_peer_and_the_next_one_serves(
    pair: tuple[Peer, Peer], tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    first, second = pair
    first.manifest = peerwire.manifest_for({"config.json": b"evil"})
    _, board = await _fetch(
        [first, second], tmp_path / "dest", _request(tls, token_file, RecordingClock())
    )
    assert _tree(tmp_path / "dest") == EXPECTED
    assert [r.path for r in first.requests] == ["manifest"]
    assert "digest" in board.why_banned()


async def test_the_deadline_ends_a_run_with_use_origin_and_leaves_nothing(
    tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    slow = Peer(
        "node-a", FILES, tls, manifest=MANIFEST, faults=Faults(stall_at={"weights/model.bin": 10})
    )
    request = _request(tls, token_file, RecordingClock(), deadline=0.5, stall_timeout=30.0)
    async with slow.running():
        with pytest.raises(peersources.FetchError, match="--deadline") as caught:
            await _fetch([slow], tmp_path / "dest", request)
    assert caught.value.use_origin
    assert not (tmp_path / "dest").exists()
