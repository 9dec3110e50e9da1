"""`localcache fetch --digest follow`: fetching from peers that still download the model
(pipelining), against real TLS peers on 127.0.0.1 (`tests.support.peerwire`).

Matrix: the files a source lists as whole are fetched while it goes on, and the run ends on
its complete manifest with the complete tree; a 404 while the source moves its folder into
place is waited out; a file that changes between two manifests, or that the complete
manifest no longer lists, ends in "use origin" with nothing in DEST; without follow, a
partial manifest is refused; files are written under a temporary name and renamed once
verified (what the agent's pipelining relies on).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from localcache.api import peer
from localcache.download import peerfetch, peersources
from tests.support import peerwire
from tests.support.peerwire import Peer
from tests.unit.download.test_peerfetch import EXPECTED, FILES, MANIFEST, RecordingClock, _tree

BIG_PART = os.urandom(1000)
ORDER = ["config.json", "tokenizer/vocab.txt", "weights/empty.bin", "weights/model.bin"]


def _partial(paths: list[str]) -> peer.PeerManifest:
    files = {p: FILES[p] for p in paths}
    listed = peerwire.manifest_for(files)
    return listed.model_copy(update={"complete": False})


@pytest.fixture
async def seed(tls: peerwire.Tls) -> AsyncIterator[Peer]:
    node = Peer("seed", FILES, tls, manifest=_partial([]))
    async with node.running():
        yield node


def _request(tls: peerwire.Tls, token_file: Path, **overrides: object) -> peerfetch.Request:
    values: dict[str, object] = {
        "storage_key": peerwire.KEY,
        "digest": peer.FOLLOW,
        "credentials": peersources.Credentials(ca_pem=tls.ca_pem, token_file=token_file),
        "max_bytes": 1 << 30,
        "deadline": 60.0,
        "stall_timeout": 0.5,
        "connect_timeout": 2.0,
        "concurrency": 2,
        "clock": RecordingClock(),
    }
    values.update(overrides)
    return peerfetch.Request(**values)  # type: ignore[arg-type]


def _progressing(node: Peer, steps: list[peer.PeerManifest | int]) -> list[str]:
    """Serve `steps` (a manifest, or a status to answer) one manifest request each, the last
    one for good; returns the log of what was served."""
    served: list[str] = []
    remaining = list(steps)

    def advance() -> None:
        step = remaining.pop(0) if len(remaining) > 1 else remaining[0]
        if isinstance(step, int):
            node.faults.status = step
            served.append(str(step))
            return
        node.faults.status = None
        node.manifest = step
        served.append("complete" if step.complete else f"{len(step.files)} files")

    node.on_manifest = advance
    return served


async def _fetch(node: Peer, dest: Path, request: peerfetch.Request) -> int:
    board = peersources.Board([peersources.parse_source(node.source)])
    return await peerfetch.fetch(request, dest, board)


async def test_files_are_fetched_as_the_source_verifies_them_until_it_is_complete(
    seed: Peer, tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    served = _progressing(
        seed, [_partial([]), _partial(ORDER[:1]), _partial(ORDER[:3]), _partial(ORDER), MANIFEST]
    )
    clock = RecordingClock()
    dest = tmp_path / "dest"
    size = await _fetch(seed, dest, _request(tls, token_file, clock=clock))

    assert size == MANIFEST.bytes
    assert _tree(dest) == EXPECTED
    assert served == ["0 files", "1 files", "3 files", "4 files", "complete"]
    file_requests = [r.path for r in seed.requests if r.path != "manifest"]
    assert sorted(file_requests) == sorted(set(FILES) - {"weights/empty.bin"})  # each once
    assert set(clock.sleeps) == {peerfetch.FOLLOW_POLL_S}


async def test_a_source_with_no_whole_file_yet_is_asked_again_beyond_the_usual_rounds(
    seed: Peer, tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    nothing_yet = [503] * (peerfetch.ROUNDS + 2)
    served = _progressing(seed, [*nothing_yet, _partial(ORDER[:1]), MANIFEST])
    clock = RecordingClock()
    dest = tmp_path / "dest"
    await _fetch(seed, dest, _request(tls, token_file, clock=clock))

    assert _tree(dest) == EXPECTED
    assert served[: len(nothing_yet)] == ["503"] * len(nothing_yet)
    assert min(clock.sleeps) >= peerfetch.FOLLOW_POLL_S


async def test_a_404_while_the_source_moves_its_folder_into_place_is_waited_out(
    seed: Peer, tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    served = _progressing(seed, [_partial(ORDER), 404, MANIFEST])
    dest = tmp_path / "dest"
    await _fetch(seed, dest, _request(tls, token_file))

    assert _tree(dest) == EXPECTED
    assert served == ["4 files", "404", "complete"]


@pytest.mark.parametrize(
    "last",
    [
        pytest.param(peerwire.manifest_for({**FILES, "config.json": b"{}"}), id="a file changed"),
        pytest.param(
            peerwire.manifest_for({p: b for p, b in FILES.items() if p != "config.json"}),
            id="a file no longer listed",
        ),
    ],
)
async def test_a_source_whose_complete_manifest_contradicts_its_partial_one_is_left(
    seed: Peer, tls: peerwire.Tls, token_file: Path, tmp_path: Path, last: peer.PeerManifest
) -> None:
    _progressing(seed, [_partial(ORDER[:1]), last])
    dest = tmp_path / "dest"
    with pytest.raises(peersources.FetchError) as caught:
        await _fetch(seed, dest, _request(tls, token_file))

    assert caught.value.use_origin
    assert "config.json" in str(caught.value)
    assert not dest.exists()


async def test_a_union_of_manifests_that_is_no_tree_is_left(
    seed: Peer, tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    first = peerwire.manifest_for({"weights": b"a file"}).model_copy(update={"complete": False})
    below = peerwire.manifest_for({"weights/model.bin": BIG_PART})
    seed.files = {"weights": b"a file", "weights/model.bin": BIG_PART}
    _progressing(seed, [first, below.model_copy(update={"complete": False})])
    dest = tmp_path / "dest"
    with pytest.raises(peersources.FetchError) as caught:
        await _fetch(seed, dest, _request(tls, token_file))

    assert caught.value.use_origin
    assert "below the file" in str(caught.value)
    assert not dest.exists()


async def test_without_follow_a_partial_manifest_is_refused(
    seed: Peer, tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    seed.manifest = _partial(ORDER)
    dest = tmp_path / "dest"
    request = _request(tls, token_file, digest=seed.manifest.digest)
    with pytest.raises(peersources.FetchError) as caught:
        await _fetch(seed, dest, request)

    assert caught.value.use_origin
    assert "digest" in str(caught.value)
    assert [r.path for r in seed.requests] == ["manifest"]


async def test_a_file_is_under_its_name_only_once_verified(
    seed: Peer, tls: peerwire.Tls, token_file: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    seen: list[str] = []  # model.bin's names, as an agent scanning the staging would find

    def on_manifest() -> None:
        for _current, _dirs, files in os.walk(dest):
            seen.extend(f for f in files if f.startswith("model.bin"))
        # complete once the big file was seen being written
        seed.manifest = MANIFEST if seen else _partial(ORDER)

    seed.on_manifest = on_manifest
    seed.faults.stall_at["weights/model.bin"] = 1_000_000  # it stays partial a while
    await _fetch(seed, dest, _request(tls, token_file))

    assert _tree(dest) == EXPECTED
    assert seen
    assert seen[0] == "model.bin" + peer.PART_SUFFIX, seen
