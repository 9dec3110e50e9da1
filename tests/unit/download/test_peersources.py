"""The pure parts of `localcache fetch`: source arguments, Retry-After, the blacklist, and the
manifest tree checks (`peerlayout.check`, `peerlayout.inside`)."""

from __future__ import annotations

import pytest

from localcache.download import peerlayout, peersources
from tests.support import peerwire


def test_a_source_is_a_node_and_an_https_base_url() -> None:
    source = peersources.parse_source("node-1=https://10.0.0.7:8476")
    assert source == peersources.Source(node="node-1", url="https://10.0.0.7:8476")
    assert source.file_url("0123456789abcdef", "a b/c#d.bin") == (
        "https://10.0.0.7:8476/p2p/v1/models/0123456789abcdef/files/a%20b/c%23d.bin"
    )
    v6 = peersources.parse_source("n=https://[fd00::7]:8476/")
    assert v6.url == "https://[fd00::7]:8476"


@pytest.mark.parametrize(
    "value",
    [
        "https://10.0.0.7:8476",
        "=https://10.0.0.7:8476",
        "n=http://10.0.0.7:8476",
        "n=https://10.0.0.7",
        "n=https://10.0.0.7:8476/path",
        "n=https://user@10.0.0.7:8476",
        "n=https://10.0.0.7:99999",
    ],
)
def test_a_malformed_source_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="--source"):
        peersources.parse_source(value)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("7", 7.0), ("3600", peersources.MAX_RETRY_AFTER_S), ("-1", 0.5), ("nan", 0.5),
     ("Wed, 21 Oct 2015 07:28:00 GMT", 0.5), (None, 0.5)],
)  # fmt: skip
def test_retry_after_is_bounded(header: str | None, seconds: float) -> None:
    assert peersources.retry_after(header, fallback=0.5) == seconds


def test_strikes_ban_a_source_and_bans_keep_the_rank_order() -> None:
    a, b, c = (peersources.parse_source(f"{n}=https://10.0.0.1:1") for n in "abc")
    board = peersources.Board([a, b, c])
    for _ in range(peersources.MAX_STRIKES - 1):
        board.strike(b, "reset")
    assert board.live() == [a, b, c]
    board.strike(b, "reset")
    board.ban(a, "HTTP 403")
    assert board.live() == [c]
    assert board.why_banned() == "b: unreliable (reset); a: HTTP 403"


@pytest.mark.parametrize(
    ("path", "target", "ok"),
    [("latest", "weights/m.bin", True), ("a/b/l", "../../x", True), ("a/l", "..", True),
     ("a/l", "../..", False), ("l", "/etc", False), ("l", "", False), ("a/l", "b/../../..", False)],
)  # fmt: skip
def test_a_link_target_must_stay_inside_lexically(path: str, target: str, ok: bool) -> None:
    assert peerlayout.inside(path, target) is ok


@pytest.mark.parametrize(
    ("files", "dirs", "links", "message"),
    [
        ({"a": b"1"}, ["a"], {}, "twice"),
        ({"a": b"1", "a/b": b"2"}, [], {}, "below the file"),
        ({"x/y": b"1"}, [], {"x": "z"}, "below the link"),
    ],
)
def test_a_tree_that_cannot_be_laid_out_is_refused(
    files: dict[str, bytes], dirs: list[str], links: dict[str, str], message: str
) -> None:
    manifest = peerwire.manifest_for(files, dirs=dirs, links=links)
    with pytest.raises(peersources.FetchError, match=message) as caught:
        peerlayout.check(manifest, max_bytes=1 << 40)
    assert caught.value.use_origin
