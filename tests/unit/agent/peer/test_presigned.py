"""What a proof's presigned HEAD may be (`check_head`) and when an ETag is this node's bytes
(`etag_matches`), on real files."""

from __future__ import annotations

import base64
import calendar
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcache.agent.peer import presigned
from localcache.api import originpaths

NOW = calendar.timegm((2026, 12, 6, 9, 0, 0))
DATE = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(NOW - 10))
ORIGIN = presigned.Origin.at(("http://10.0.0.9:9000", "https://s3.example.com"), "models", "bert")
QUERY = (
    "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20261206%2Fus-east-1%2Fs3%2F"
    f"aws4_request&X-Amz-Date={DATE}&X-Amz-Expires=60&X-Amz-SignedHeaders=host%3Bif-none-match"
    "&X-Amz-Signature=" + "ab" * 32
)


def _url(base: str = "http://10.0.0.9:9000/models/bert/model.bin", query: str = QUERY) -> str:
    return f"{base}?{query}"


@pytest.mark.parametrize(
    ("url", "path"),
    [
        (_url(), "model.bin"),
        (_url("http://10.0.0.9:9000/models/bert/tok%2Fvocab.txt"), "tok/vocab.txt"),
        (_url("http://10.0.0.9:9000/models/bert/tok/vocab.txt"), "tok/vocab.txt"),
        (_url("https://models.s3.example.com/bert/model.bin"), "model.bin"),
        (_url("https://s3.example.com:443/models/bert/model.bin"), "model.bin"),
        (_url(query=QUERY + "&X-Amz-Security-Token=tok&x-id=HeadObject"), "model.bin"),
    ],
)
def test_a_presigned_head_of_the_files_object_at_an_allowed_origin_is_run(
    url: str, path: str
) -> None:
    assert presigned.check_head(url, path, ORIGIN, now=NOW) == presigned.Head(url, NOW + 50)


def test_a_presign_that_signed_the_checksum_mode_asks_for_the_objects_checksum() -> None:
    url = _url(query=QUERY.replace("if-none-match", "if-none-match%3Bx-amz-checksum-mode"))
    want = presigned.Head(url, NOW + 50, checksum=True)
    assert presigned.check_head(url, "model.bin", ORIGIN, now=NOW) == want
    other = _url(query=QUERY.replace("if-none-match", "if-none-match%3Brange"))
    assert presigned.check_head(other, "model.bin", ORIGIN, now=NOW) == presigned.Bad(
        "proof-malformed"
    )


def test_only_a_full_object_sha256_checksum_counts() -> None:
    digest = hashlib.sha256(b"model").digest()
    encoded = base64.b64encode(digest).decode()
    assert originpaths.s3_checksum_sha256(encoded, None) == digest.hex()
    assert originpaths.s3_checksum_sha256(encoded, "FULL_OBJECT") == digest.hex()
    assert originpaths.s3_checksum_sha256(encoded, "COMPOSITE") is None
    assert originpaths.s3_checksum_sha256(encoded + "-3", None) is None
    assert originpaths.s3_checksum_sha256(base64.b64encode(b"short").decode(), None) is None
    assert originpaths.s3_checksum_sha256(None, None) is None


def test_a_single_object_model_maps_to_its_base_name() -> None:
    origin = presigned.Origin(ORIGIN.endpoints, "models", "bert/model.bin")
    url = _url()
    assert presigned.check_head(url, "model.bin", origin, now=NOW) == presigned.Head(url, NOW + 50)
    assert originpaths.s3_folder_path("bert", "bert/tok/vocab.txt") == "tok/vocab.txt"
    assert originpaths.s3_folder_path("", "a/b") == "a/b"


@pytest.mark.parametrize(
    ("url", "path", "reason"),
    [
        (_url("http://10.0.0.10:9000/models/bert/model.bin"), "model.bin", "proof-origin"),
        (_url("https://10.0.0.9:9000/models/bert/model.bin"), "model.bin", "proof-origin"),
        (_url("http://10.0.0.9:9001/models/bert/model.bin"), "model.bin", "proof-origin"),
        (_url("https://evil.example.com/models/bert/model.bin"), "model.bin", "proof-origin"),
        (_url("https://other.s3.example.com/bert/model.bin"), "model.bin", "proof-origin"),
        (_url("http://models.10.0.0.9:9000/bert/model.bin"), "model.bin", "proof-origin"),
        (_url("http://10.0.0.9:9000/other/bert/model.bin"), "model.bin", "proof-object"),
        (_url("http://10.0.0.9:9000/models/bert/other.bin"), "model.bin", "proof-object"),
        (_url("http://10.0.0.9:9000/models/bert2/model.bin"), "model.bin", "proof-object"),
        (_url("http://10.0.0.9:9000/models/ber/model.bin"), "model.bin", "proof-object"),
        (_url(query=QUERY.replace("X-Amz-Expires=60", "X-Amz-Expires=61")), "model.bin",
         "proof-malformed"),
        (_url(query=QUERY.replace("AWS4-HMAC-SHA256", "AWS4-ECDSA-P256-SHA256")), "model.bin",
         "proof-malformed"),
        (_url(query=QUERY + "&versionId=3"), "model.bin", "proof-malformed"),
        (_url(query=QUERY.replace("host%3Bif-none-match", "host")), "model.bin",
         "proof-malformed"),  # the nonce not signed: good for any node, any number of times
        (_url(query=QUERY + "&X-Amz-Expires=60"), "model.bin", "proof-malformed"),
        (_url(query=QUERY.replace("&X-Amz-Signature=" + "ab" * 32, "")), "model.bin",
         "proof-malformed"),
        (_url(query=QUERY.replace(DATE, time.strftime("%Y%m%dT%H%M%SZ",
                                                       time.gmtime(NOW - 60)))),
         "model.bin", "proof-expired"),
        (_url(query=QUERY.replace(DATE, time.strftime("%Y%m%dT%H%M%SZ",
                                                       time.gmtime(NOW + 3600)))),
         "model.bin", "proof-malformed"),
        ("http://user:pw@10.0.0.9:9000/models/bert/model.bin?" + QUERY, "model.bin",
         "proof-malformed"),
        ("ftp://10.0.0.9/models/bert/model.bin?" + QUERY, "model.bin", "proof-malformed"),
        (_url(query=QUERY + "&x-id=Head%00Object"), "model.bin", "proof-malformed"),
        (_url(query=QUERY + "&x-id=Head\x00Object"), "model.bin", "proof-malformed"),
        (_url(query=QUERY.replace(DATE, time.strftime("%Y%m%dT%H%M%SZ",
                                                       time.gmtime(NOW + 30)))),
         "model.bin", "proof-malformed"),
    ],
)  # fmt: skip
def test_anything_else_is_refused_with_its_reason(url: str, path: str, reason: str) -> None:
    assert presigned.check_head(url, path, ORIGIN, now=NOW) == presigned.Bad(reason)  # type: ignore[arg-type]


@pytest.fixture
def fd(tmp_path: Path) -> Iterator[tuple[int, bytes]]:
    data = os.urandom(presigned.MIB * 11 + 5)
    path = tmp_path / "model.bin"
    path.write_bytes(data)
    handle = os.open(path, os.O_RDONLY)
    try:
        yield handle, data
    finally:
        os.close(handle)


def _multipart(data: bytes, part: int) -> str:
    parts = [hashlib.md5(data[i : i + part]).digest() for i in range(0, len(data), part)]
    return f'"{hashlib.md5(b"".join(parts)).hexdigest()}-{len(parts)}"'


def test_an_etag_is_the_md5_of_the_bytes_single_or_multipart(fd: tuple[int, bytes]) -> None:
    handle, data = fd
    size = len(data)
    assert presigned.etag_matches(handle, size, f'"{hashlib.md5(data).hexdigest()}"')
    assert presigned.etag_matches(handle, size, _multipart(data, 8 * presigned.MIB))
    assert presigned.etag_matches(handle, size, _multipart(data, 6 * presigned.MIB))  # implied
    assert presigned.etag_matches(handle, size, _multipart(data, size))  # one part: "-1"


def test_an_etag_of_other_bytes_or_no_md5_shape_is_no_match(fd: tuple[int, bytes]) -> None:
    handle, data = fd
    size = len(data)
    other = bytearray(data)
    other[-1] ^= 1
    assert not presigned.etag_matches(handle, size, f'"{hashlib.md5(other).hexdigest()}"')
    assert not presigned.etag_matches(handle, size, _multipart(bytes(other), 8 * presigned.MIB))
    assert not presigned.etag_matches(handle, size, '"kms-' + "0" * 28 + '"')
    # parts of no size it tries (not a whole MiB): not provable, so no match
    assert not presigned.etag_matches(handle, size, _multipart(data, 5 * presigned.MIB // 2))


def test_an_empty_file_has_the_md5_of_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    handle = os.open(tmp_path / "empty", os.O_RDONLY)
    try:
        assert presigned.etag_matches(handle, 0, f'"{hashlib.md5(b"").hexdigest()}"')
    finally:
        os.close(handle)
