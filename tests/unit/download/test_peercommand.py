"""`localcache fetch` as a command: exit codes (0 done, 3 use origin, 1 local failure), one
line on stderr, and the FetchReport written to --report in every outcome.

The command runs `asyncio.run` itself, so it runs in a thread here while the TLS peer serves
on the test's event loop.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

from localcache import cli
from localcache.api import peer
from localcache.download import peercommand, peerfetch, peersources
from tests.support import peerwire
from tests.support.peerwire import Faults, HttpOrigin, Peer

FILES = {"config.json": b"{}", "weights/model.bin": b"w" * 70_000}
MANIFEST = peerwire.manifest_for(FILES, dirs=["weights"])


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peerfetch, "BACKOFF_S", 0.001)


@pytest.fixture
def tls(tmp_path: Path) -> peerwire.Tls:
    return peerwire.tls_material(tmp_path, [peer.SERVER_NAME])


def _argv(
    tmp_path: Path,
    sources: list[str],
    *,
    digest: str = MANIFEST.digest,
    extra: tuple[str, ...] = (),
) -> list[str]:
    token = tmp_path / "token"
    if not token.exists():
        token.write_text("a-token")
    argv = ["fetch", "--storage-key", peerwire.KEY, "--digest", digest]
    for source in sources:
        argv += ["--source", source]
    argv += ["--token-file", str(token), "--ca-env", "TEST_PEER_CA"]
    argv += ["--report", str(tmp_path / "report"), "--stall-timeout", "2", *extra]
    return [*argv, str(tmp_path / "dest")]


def _report(tmp_path: Path) -> dict[str, object]:
    data = (tmp_path / "report").read_bytes()
    assert len(data) <= peercommand.MAX_REPORT_BYTES
    report: dict[str, object] = json.loads(data)
    peer.FetchReport.model_validate(report)
    return report


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_a_fetch_exits_0_and_reports_the_bytes_per_source(
    tls: peerwire.Tls,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TEST_PEER_CA", tls.ca_pem)
    peer_ = Peer("node-a", FILES, tls, manifest=MANIFEST)
    async with peer_.running():
        code = await asyncio.to_thread(cli.main, _argv(tmp_path, [peer_.source]))
    assert code == 0
    assert (tmp_path / "dest" / "weights" / "model.bin").read_bytes() == FILES["weights/model.bin"]
    assert _report(tmp_path) == {
        "outcome": "complete",
        "peerBytes": MANIFEST.bytes,
        "originBytes": 0,
        "sources": {"node-a": MANIFEST.bytes},
    }
    assert "a-token" not in capsys.readouterr().out


async def test_a_source_serving_bad_bytes_is_named_in_the_report(
    tls: peerwire.Tls, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_PEER_CA", tls.ca_pem)
    bad = Peer("node-a", FILES, tls, manifest=MANIFEST, faults=Faults(flip={"config.json"}))
    async with bad.running():
        code = await asyncio.to_thread(cli.main, _argv(tmp_path, [bad.source]))
    assert code == peer.EXIT_USE_ORIGIN
    report = _report(tmp_path)
    assert report["outcome"] == "use-origin"
    bad_sources = report["badSources"]
    assert isinstance(bad_sources, dict)
    assert list(bad_sources) == ["node-a"]
    assert "sha256" in bad_sources["node-a"]


async def test_no_peer_able_to_serve_exits_3_leaving_dest_untouched(
    tls: peerwire.Tls,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TEST_PEER_CA", tls.ca_pem)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep").write_text("mine")
    sources = [f"node-{i}=https://127.0.0.1:{_free_port()}" for i in "ab"]
    code = await asyncio.to_thread(cli.main, _argv(tmp_path, sources))
    assert code == peer.EXIT_USE_ORIGIN
    assert [p.name for p in dest.iterdir()] == ["keep"]
    err = capsys.readouterr().err.strip()
    assert err.startswith("localcache fetch: error: no peer served the manifest")
    assert "\n" not in err
    report = _report(tmp_path)
    assert report["outcome"] == "use-origin"
    assert "no peer served the manifest" in str(report["reason"])


async def test_a_model_over_the_max_size_from_the_environment_exits_3(
    tls: peerwire.Tls, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_PEER_CA", tls.ca_pem)
    monkeypatch.setenv(peercommand.MAX_SIZE_ENV, "1Ki")
    peer_ = Peer("node-a", FILES, tls, manifest=MANIFEST)
    async with peer_.running():
        code = await asyncio.to_thread(cli.main, _argv(tmp_path, [peer_.source]))
    assert code == peer.EXIT_USE_ORIGIN
    assert "--max-size" in str(_report(tmp_path)["reason"])
    assert not (tmp_path / "dest").exists()


async def test_a_file_the_peer_breaks_off_is_finished_from_the_origin_and_reported(
    tls: peerwire.Tls, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_PEER_CA", tls.ca_pem)
    data = FILES["weights/model.bin"]
    files = {"model.bin": data}
    manifest = peerwire.manifest_for(files)
    faults = Faults(cut_at={"model.bin": 30_000}, status_after_cut=502)
    dying = Peer("node-a", files, tls, manifest=manifest, faults=faults)
    async with dying.running(), HttpOrigin(data).running() as origin:
        argv = _argv(
            tmp_path, [dying.source], digest=manifest.digest,
            extra=("--resume-origin", origin.url),
        )  # fmt: skip
        code = await asyncio.to_thread(cli.main, argv)
    assert code == 0
    assert (tmp_path / "dest" / "model.bin").read_bytes() == data
    report = _report(tmp_path)
    assert report["outcome"] == "complete"
    assert 0 < int(report["originBytes"]) < len(data)  # type: ignore[call-overload]
    assert report["peerBytes"] == len(data) - report["originBytes"]  # type: ignore[operator]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"digest": "md5:abc"}, "invalid --digest"),
        ({"sources": ["node-a=http://127.0.0.1:1"]}, "https://IP:PORT"),
        ({"sources": ["https://127.0.0.1:1"]}, "NODE=https://IP:PORT"),
        ({"sources": [f"n{i}=https://127.0.0.1:{i + 1}" for i in range(4)]}, "at most 3"),
        ({"extra": ("--concurrency", "0")}, "--concurrency"),
        ({"extra": ("--max-size", "lots")}, "invalid --max-size"),
        ({"extra": ("--resume-origin", "https://h/model.tar")}, "invalid --resume-origin"),
        ({"ca": ""}, "TEST_PEER_CA is unset"),
        ({"ca": "not a pem"}, "not a valid PEM"),
        ({"token": ""}, "no usable token"),
    ],
)
def test_bad_arguments_exit_1_with_one_line_and_a_report(
    change: dict[str, object],
    message: str,
    tls: peerwire.Tls,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TEST_PEER_CA", str(change.get("ca", tls.ca_pem)))
    if "token" in change:
        (tmp_path / "token").write_text(str(change["token"]))
    sources = change.get("sources", ["node-a=https://127.0.0.1:1"])
    argv = _argv(
        tmp_path,
        list(sources),  # type: ignore[call-overload]
        digest=str(change.get("digest", MANIFEST.digest)),
        extra=tuple(change.get("extra", ())),  # type: ignore[arg-type]
    )
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("localcache fetch: error: ")
    assert message in err
    assert "\n" not in err
    assert _report(tmp_path)["outcome"] == "failed"


def test_an_unwritable_report_does_not_change_the_outcome(
    tls: peerwire.Tls, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_PEER_CA", tls.ca_pem)
    argv = _argv(tmp_path, [f"node-a=https://127.0.0.1:{_free_port()}"])
    argv[argv.index("--report") + 1] = str(tmp_path / "no" / "such" / "dir" / "report")
    assert peercommand.main(argv[1:]) == peer.EXIT_USE_ORIGIN


def test_the_report_is_bounded(tmp_path: Path) -> None:
    names = [f"{'n' * 250}{i}=https://10.0.0.{i}:1" for i in "123"]
    board = peersources.Board([peersources.parse_source(n) for n in names])
    for source in board.sources:
        board.received(source, 1 << 40)
    peercommand._report(str(tmp_path / "report"), "failed", board, "x\n" * 10_000)
    report = _report(tmp_path)  # parsed, validated and at most 4 KiB
    assert str(report["reason"]).startswith("x x x")
    assert len(str(report["reason"])) <= 256
    assert report["peerBytes"] == 3 << 40


def test_a_report_at_its_longest_is_never_cut(tmp_path: Path) -> None:
    """Four sources with 253-character names, each corrupt, and a 256-character reason: the
    report drops what does not fit instead of being cut mid-JSON (which parses as nothing)."""
    names = [f"{i}{'n' * 252}" for i in range(peer.MAX_SOURCES + 1)]
    board = peersources.Board([peersources.Source(n, "https://10.0.0.1:8476") for n in names])
    for name in names:
        board.received(peersources.Source(name, ""), 1 << 40)
        board.corrupted(peersources.Source(name, ""), "é" * 400)
    path = tmp_path / "report"
    peercommand._report(str(path), "use-origin", board, "r" * 1000)
    data = path.read_bytes()
    assert len(data) <= peercommand.MAX_REPORT_BYTES
    report = peer.FetchReport.model_validate_json(data)
    assert report.outcome == "use-origin"
    assert report.peer_bytes == (peer.MAX_SOURCES + 1) << 40
