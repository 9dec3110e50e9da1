"""`peerproof.prove` and `localcache fetch --prove-s3`: the sources that accept the proof are
kept, those that refuse it (any answer but 200 proven) are banned with their reason, and the
run uses the origin when none accepts or when the origin refuses this pod's listing.

The peers are real TLS servers (`tests.support.peerwire`) with a proofs route of the test's;
they record the proofs and never run the presigned HEADs. The listing runs against the test
object store (moto, credentials enforced).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from aiohttp import web

from localcache import cli
from localcache.api import peer
from localcache.download import peerfetch, peerproof, peersources, s3origin
from tests.support import objectstore, peerwire
from tests.support.peerwire import Peer

BUCKET = "models"
URI = f"s3://{BUCKET}/iris"
FILES = {"config.json": b"{}", "weights/model.bin": b"w" * 5000}
MANIFEST = peerwire.manifest_for(FILES, dirs=["weights"])
NO_S3: dict[str, object] = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Action": "iam:GetUser", "Resource": "*"},
    ],
}
Answer = tuple[int, peer.ProofAnswer | str, dict[str, str]]
PROVEN: Answer = (200, peer.ProofAnswer(proven=True, digest=MANIFEST.digest), {})
DENIED: Answer = (403, peer.ProofAnswer(proven=False, reason="proof-denied"), {})
BUSY: Answer = (429, peer.ProofAnswer(proven=False, reason="proof-busy"), {"Retry-After": "60"})


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[objectstore.ObjectStore]:
    log = tmp_path_factory.mktemp("objectstore") / "objectstore.log"
    with objectstore.ObjectStore(log_path=log).start() as started:
        started.create_bucket(BUCKET)
        for path, data in FILES.items():
            started.put_object(BUCKET, f"iris/{path}", data)
        yield started


@pytest.fixture(scope="module")
def reader(store: objectstore.ObjectStore) -> objectstore.AccessKey:
    return store.create_user("reader")


@pytest.fixture(scope="module")
def origin(store: objectstore.ObjectStore, reader: objectstore.AccessKey) -> s3origin.S3Origin:
    return s3origin.S3Origin.from_env(store.s3_env(reader))


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("a-token")
    return path


class Sleeps:
    """A clock whose sleeps return at once and are recorded."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def now(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await asyncio.sleep(0)


@dataclasses.dataclass
class Proofs:
    """A peer's answers to proofs, in order (the last one repeats), and the proofs it got."""

    answers: list[Answer]
    got: list[tuple[str | None, str | None, peer.ProofRequest]] = dataclasses.field(
        default_factory=list
    )
    nonces: list[str] = dataclasses.field(default_factory=list)
    """The nonces it issued, in order: each proof must carry the last one."""


def answering(peer_: Peer, *answers: Answer) -> Proofs:
    """Give `peer_` (not yet running) a proofs route answering `answers`."""
    proofs = Proofs(list(answers))

    async def handle(request: web.Request) -> web.Response:
        body = peer.ProofRequest.model_validate_json(await request.read())
        assert body.nonce == proofs.nonces[-1], "a proof without the nonce just issued"
        assert all("if-none-match" in h.url for h in body.heads), "the nonce is not signed"
        headers = request.headers
        proofs.got.append((headers.get("Authorization"), headers.get("Content-Type"), body))
        status, answer, extra = proofs.answers[min(len(proofs.got), len(proofs.answers)) - 1]
        if isinstance(answer, str):
            return web.Response(status=status, text=answer, headers=extra)
        text = answer.model_dump_json(by_alias=True, exclude_none=True)
        return web.json_response(text=text, status=status, headers=extra)

    async def nonce(request: web.Request) -> web.Response:
        proofs.nonces.append(f"lc-{len(proofs.nonces):032x}")
        return web.json_response(text=peer.ProofNonce(nonce=proofs.nonces[-1]).model_dump_json())

    peer_.app.router.add_post(f"{peer.WIRE_PREFIX}/models/{{key}}/proofs", handle)
    peer_.app.router.add_get(f"{peer.WIRE_PREFIX}/models/{{key}}/proofs/nonce", nonce)
    return proofs


def _request(tls: peerwire.Tls, token_file: Path, clock: Sleeps) -> peerfetch.Request:
    return peerwire.fetch_request(
        tls, token_file, digest=MANIFEST.digest, clock=clock, deadline=30.0, stall_timeout=2.0
    )


def _board(*peers: Peer | str) -> peersources.Board:
    return peersources.Board(
        [peersources.parse_source(p if isinstance(p, str) else p.source) for p in peers]
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_a_refusing_source_is_banned_and_an_accepting_one_kept(
    tls: peerwire.Tls, token_file: Path, origin: s3origin.S3Origin
) -> None:
    refusing, accepting = Peer("node-a", FILES, tls), Peer("node-b", FILES, tls)
    refused, accepted = answering(refusing, DENIED), answering(accepting, PROVEN)
    with structlog.testing.capture_logs() as logs:
        async with refusing.running(), accepting.running():
            board = _board(refusing, accepting)
            await peerproof.prove(
                _request(tls, token_file, Sleeps()), board, uri=URI, origin=origin
            )

    assert [s.node for s in board.live()] == ["node-b"]
    assert board.why_banned() == "node-a: proof refused: HTTP 403 (proof-denied)"
    for proofs in (refused, accepted):
        [(token, content_type, proof)] = proofs.got
        assert (token, content_type) == ("Bearer a-token", "application/json")
        assert proof.uri == URI
        assert sorted(h.path for h in proof.heads) == sorted(FILES)
    assert "X-Amz-Signature" not in json.dumps(logs, default=str)
    assert {e["event"] for e in logs} >= {"fetch.proof_refused", "fetch.proof_accepted"}


async def test_no_source_accepting_uses_the_origin_with_their_reasons(
    tls: peerwire.Tls, token_file: Path, origin: s3origin.S3Origin
) -> None:
    peers = [Peer(f"node-{n}", FILES, tls) for n in "abc"]
    answering(peers[0], DENIED)
    answering(peers[1], (409, peer.ProofAnswer(proven=False, reason="proof-mismatch"), {}))
    answering(peers[2], (403, "not-entitled\n", {}))  # the server's plain-text refusals
    async with peers[0].running(), peers[1].running(), peers[2].running():
        with pytest.raises(peersources.FetchError) as error:
            await peerproof.prove(
                _request(tls, token_file, Sleeps()), _board(*peers), uri=URI, origin=origin
            )

    assert error.value.use_origin
    assert str(error.value) == (
        "no peer accepted the proof: node-a: proof refused: HTTP 403 (proof-denied); "
        "node-b: proof refused: HTTP 409 (proof-mismatch); "
        "node-c: proof refused: HTTP 403 (not-entitled)"
    )


async def test_a_source_that_issues_no_nonce_is_refused_and_gets_no_proof(
    tls: peerwire.Tls, token_file: Path, origin: s3origin.S3Origin
) -> None:
    """An agent without the nonce route (an older one): no presign is made for it."""
    old, current = Peer("node-a", FILES, tls), Peer("node-b", FILES, tls)
    proofs = answering(current, PROVEN)
    async with old.running(), current.running():
        board = _board(old, current)
        await peerproof.prove(_request(tls, token_file, Sleeps()), board, uri=URI, origin=origin)

    assert [s.node for s in board.live()] == ["node-b"]
    assert board.why_banned().startswith("node-a: proof refused: HTTP 404 (no nonce"), (
        board.why_banned()
    )
    assert len(proofs.got) == 1


@pytest.mark.parametrize(
    ("answers", "kept", "asked", "slept"),
    [
        ([BUSY, PROVEN], True, 2, [5.0]),
        ([BUSY], False, peerproof.PROOF_ATTEMPTS, [5.0] * (peerproof.PROOF_ATTEMPTS - 1)),
    ],
    ids=["busy-then-proven", "always-busy"],
)
async def test_a_busy_source_is_asked_again_after_its_retry_after_at_most_5_s(
    tls: peerwire.Tls,
    token_file: Path,
    origin: s3origin.S3Origin,
    answers: list[Answer],
    kept: bool,
    asked: int,
    slept: list[float],
) -> None:
    busy, other = Peer("node-a", FILES, tls), Peer("node-b", FILES, tls)
    proofs = answering(busy, *answers)
    answering(other, PROVEN)
    clock = Sleeps()
    async with busy.running(), other.running():
        board = _board(busy, other)
        await peerproof.prove(_request(tls, token_file, clock), board, uri=URI, origin=origin)

    assert len(proofs.got) == asked
    assert clock.slept == slept
    assert ("node-a" in [s.node for s in board.live()]) is kept
    if not kept:
        assert board.why_banned() == "node-a: proof refused: HTTP 429 (proof-busy)"


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (None, "transport ("),
        ((200, "x" * 5000, {}), "HTTP 200 (an answer over 4096 bytes)"),
        (
            (200, peer.ProofAnswer(proven=True, digest="sha256:" + "0" * 64), {}),
            "HTTP 200, proven for another digest",
        ),
        ((200, peer.ProofAnswer(proven=False, reason="no\x1b[31m"), {}), "HTTP 200 (no [31m)"),
        ((503, "shutting-down\n", {"Retry-After": "1"}), "HTTP 503 (shutting-down)"),
    ],
    ids=["nobody-listening", "huge-answer", "other-digest", "not-proven", "unavailable"],
)
async def test_any_answer_but_proven_bans_the_source(
    tls: peerwire.Tls,
    token_file: Path,
    origin: s3origin.S3Origin,
    answer: Answer | None,
    reason: str,
) -> None:
    peer_ = Peer("node-a", FILES, tls)
    if answer is not None:
        answering(peer_, answer)
    async with peer_.running():
        board = _board(peer_ if answer else f"node-a=https://127.0.0.1:{_free_port()}")
        with pytest.raises(peersources.FetchError) as error:
            await peerproof.prove(
                _request(tls, token_file, Sleeps()), board, uri=URI, origin=origin
            )

    assert error.value.use_origin
    prefix = "no peer accepted the proof: node-a: proof refused: "
    assert str(error.value).startswith(prefix + reason)


async def test_a_listing_the_origin_refuses_uses_the_origin_and_asks_no_peer(
    tls: peerwire.Tls, token_file: Path, store: objectstore.ObjectStore
) -> None:
    key = await asyncio.to_thread(store.create_user, "no-s3", policy=NO_S3)
    refused = await asyncio.to_thread(s3origin.S3Origin.from_env, store.s3_env(key))
    peer_ = Peer("node-a", FILES, tls)
    proofs = answering(peer_, PROVEN)
    async with peer_.running():
        with pytest.raises(peersources.FetchError) as error:
            await peerproof.prove(
                _request(tls, token_file, Sleeps()), _board(peer_), uri=URI, origin=refused
            )

    assert error.value.use_origin
    assert str(error.value) == f"the origin refused to list {URI}: AccessDenied (HTTP 403)"
    assert proofs.got == []


# ---- the command: `localcache fetch --prove-s3` -----------------------------------------


def _argv(tmp_path: Path, sources: list[str], *extra: str) -> list[str]:
    argv = ["fetch", "--storage-key", peerwire.KEY, "--digest", MANIFEST.digest]
    for source in sources:
        argv += ["--source", source]
    argv += ["--token-file", str(tmp_path / "token"), "--ca-env", "TEST_PEER_CA"]
    argv += ["--report", str(tmp_path / "report"), "--stall-timeout", "2", *extra]
    return [*argv, str(tmp_path / "dest")]


def _report(tmp_path: Path) -> dict[str, object]:
    report: dict[str, object] = json.loads((tmp_path / "report").read_bytes())
    peer.FetchReport.model_validate(report)
    return report


@pytest.fixture
def pod_env(
    tls: peerwire.Tls,
    token_file: Path,
    store: objectstore.ObjectStore,
    reader: objectstore.AccessKey,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The download pod's environment: the peer CA and the tenant's S3 credentials."""
    monkeypatch.setenv("TEST_PEER_CA", tls.ca_pem)
    for name, value in store.s3_env(reader).items():
        monkeypatch.setenv(name, value)


@pytest.mark.usefixtures("pod_env")
async def test_fetch_with_prove_s3_fetches_from_the_source_that_accepted(
    tls: peerwire.Tls, tmp_path: Path
) -> None:
    refusing = Peer("node-a", FILES, tls, manifest=MANIFEST)
    accepting = Peer("node-b", FILES, tls, manifest=MANIFEST)
    answering(refusing, DENIED)
    answering(accepting, PROVEN)
    async with refusing.running(), accepting.running():
        argv = _argv(tmp_path, [refusing.source, accepting.source], "--prove-s3", URI)
        code = await asyncio.to_thread(cli.main, argv)

    assert code == 0
    assert (tmp_path / "dest" / "weights" / "model.bin").read_bytes() == FILES["weights/model.bin"]
    assert refusing.requests == []  # banned before the transfer
    assert _report(tmp_path)["sources"] == {"node-b": MANIFEST.bytes}


@pytest.mark.usefixtures("pod_env")
async def test_fetch_with_prove_s3_refused_everywhere_exits_3_with_the_reason(
    tls: peerwire.Tls, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refusing = Peer("node-a", FILES, tls, manifest=MANIFEST)
    answering(refusing, DENIED)
    async with refusing.running():
        argv = _argv(tmp_path, [refusing.source], "--prove-s3", URI)
        code = await asyncio.to_thread(cli.main, argv)

    assert code == peer.EXIT_USE_ORIGIN
    err = capsys.readouterr().err.strip()
    assert err == (
        "localcache fetch: error: no peer accepted the proof: "
        "node-a: proof refused: HTTP 403 (proof-denied)"
    )
    report = _report(tmp_path)
    assert report["outcome"] == "use-origin"
    assert str(report["reason"]).startswith("no peer accepted the proof")
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("uri", ["gs://models/iris", "s3://", "s3://models/" + "x" * peer.MAX_URI])
def test_an_invalid_prove_s3_exits_1(
    uri: str, tls: peerwire.Tls, token_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_PEER_CA", tls.ca_pem)
    argv = _argv(tmp_path, ["node-a=https://127.0.0.1:1"], "--prove-s3", uri)

    assert cli.main(argv) == 1
    assert _report(tmp_path)["outcome"] == "failed"
