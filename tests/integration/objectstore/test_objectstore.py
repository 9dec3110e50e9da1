"""The test object store refuses every request that is not signed by a user it knows."""

from __future__ import annotations

import hashlib
import http.client
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple
from xml.etree import ElementTree

import botocore.exceptions
import pytest

from localcache.devenv import modelserver, waiting
from tests.support import objectstore

BUCKET = "models"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[objectstore.ObjectStore]:
    log = tmp_path_factory.mktemp("objectstore") / "objectstore.log"
    with objectstore.ObjectStore(log_path=log).start() as started:
        started.create_bucket(BUCKET)
        started.put_object(BUCKET, "iris/model.joblib", b"iris weights")
        yield started


def _refused(call: Callable[[], object]) -> tuple[int, str]:
    """(HTTP status, error code) of a call that must be refused."""
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call()
    return objectstore.status_of(caught.value)


def test_object_put_with_admin_key_is_readable_with_a_created_users_key(
    store: objectstore.ObjectStore,
) -> None:
    store.put_object(BUCKET, "sklearn/model.bin", b"\x00\x01weights\xff")
    reader = store.client("s3", store.create_user("reader"))

    got = reader.get_object(Bucket=BUCKET, Key="sklearn/model.bin")["Body"].read()

    assert got == b"\x00\x01weights\xff"
    assert store.list_keys(BUCKET, "sklearn/") == ["sklearn/model.bin"]


@pytest.mark.parametrize(
    "path",
    [f"/{BUCKET}/iris/model.joblib", f"/{BUCKET}", f"/{BUCKET}?list-type=2", "/"],
    ids=["object", "bucket", "listing", "service"],
)
def test_anonymous_request_is_refused_with_403(store: objectstore.ObjectStore, path: str) -> None:
    status, body = modelserver.http_get(store.endpoint + path)

    assert status == 403
    assert b"<Code>AccessDenied</Code>" in body
    assert b"iris weights" not in body


def test_get_signed_with_a_made_up_key_is_refused(store: objectstore.ObjectStore) -> None:
    stranger = store.client("s3", objectstore.AccessKey("AKIAMADEUPKEY0000000", "made-up"))

    status, code = _refused(lambda: stranger.get_object(Bucket=BUCKET, Key="iris/model.joblib"))

    assert (status, code) == (403, "InvalidAccessKeyId")


def test_listing_with_the_wrong_secret_is_refused(store: objectstore.ObjectStore) -> None:
    key_id, _ = store.create_user("lister")
    wrong = store.client("s3", objectstore.AccessKey(key_id, "not-the-secret"))

    status, code = _refused(lambda: wrong.list_objects_v2(Bucket=BUCKET))

    assert (status, code) == (403, "SignatureDoesNotMatch")


def test_user_without_s3_permission_is_denied(store: objectstore.ObjectStore) -> None:
    nothing = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Deny", "Action": "s3:*", "Resource": "*"}],
    }
    outsider = store.client("s3", store.create_user("outsider", policy=nothing))

    status, code = _refused(lambda: outsider.get_object(Bucket=BUCKET, Key="iris/model.joblib"))

    assert (status, code) == (403, "AccessDenied")


def test_moto_control_api_cannot_turn_auth_off(store: objectstore.ObjectStore) -> None:
    status, _ = modelserver.http_get(store.endpoint + "/moto-api/data.json")
    assert status == 403

    assert (
        _refused(lambda: store.client("s3", objectstore.AccessKey("x", "y")).list_buckets())[0]
        == 403
    )


def test_log_records_the_requests(store: objectstore.ObjectStore) -> None:
    assert store.log_path is not None
    assert "PUT /models" in Path(store.log_path).read_text()


def test_the_store_counts_the_body_bytes_it_serves(store: objectstore.ObjectStore) -> None:
    data = bytes(range(256)) * 1024
    store.put_object(BUCKET, "counted/model.bin", data)
    requests_before, sent_before = store.bytes_sent()

    assert store.get_object(BUCKET, "counted/model.bin") == data

    requests_after, sent_after = store.bytes_sent()
    assert requests_after == requests_before + 1
    assert sent_after - sent_before == len(data)
    status, _ = modelserver.http_get(store.endpoint + objectstore.STATS_PATH)
    assert status == 200  # the counters need no signature: they hold no data


# ---- presigned (SigV4 query-authenticated) requests ---------------------------------------

OBJECT = "iris/model.joblib"
OBJECT_BYTES = b"iris weights"
GET_ONLY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}],
}
LIST_ONLY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "*"}],
}


class Answer(NamedTuple):
    status: int
    headers: Mapping[str, str]
    body: bytes

    def error(self) -> tuple[int, str, str]:
        """(status, S3 error code, message) of a refusal with a body."""
        root = ElementTree.fromstring(self.body)
        return self.status, root.findtext("Code") or "", root.findtext("Message") or ""


def _send(method: str, url: str, *, headers: Mapping[str, str] | None = None) -> Answer:
    """One request of `url` as given (no signing of its own), with a timeout."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10.0)
    try:
        conn.request(method, f"{parts.path}?{parts.query}", headers=dict(headers or {}))
        response = conn.getresponse()
        return Answer(response.status, dict(response.getheaders()), response.read())
    finally:
        conn.close()


@pytest.fixture(scope="module")
def reader(store: objectstore.ObjectStore) -> objectstore.AccessKey:
    """A user allowed s3:GetObject (which HeadObject needs) and nothing else."""
    return store.create_user("presign-reader", policy=GET_ONLY)


def _head_url(
    store: objectstore.ObjectStore, key: objectstore.AccessKey, *, expires_s: int = 60
) -> str:
    key_id, secret = key
    return store.presigned_head(BUCKET, OBJECT, key_id=key_id, secret=secret, expires_s=expires_s)


def _get_url(
    store: objectstore.ObjectStore, key: objectstore.AccessKey, *, expires_s: int = 60
) -> str:
    key_id, secret = key
    return store.presigned_get(BUCKET, OBJECT, key_id=key_id, secret=secret, expires_s=expires_s)


def test_presigned_head_answers_the_objects_etag_and_length(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey
) -> None:
    answer = _send("HEAD", _head_url(store, reader))

    assert answer.status == 200
    assert answer.headers["ETag"] == f'"{hashlib.md5(OBJECT_BYTES).hexdigest()}"'
    assert answer.headers["Content-Length"] == str(len(OBJECT_BYTES))
    assert answer.body == b""


def test_presigned_get_answers_the_objects_bytes_and_is_counted(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey
) -> None:
    requests_before, sent_before = store.bytes_sent()

    answer = _send("GET", _get_url(store, reader))

    assert (answer.status, answer.body) == (200, OBJECT_BYTES)
    assert store.bytes_sent() == (requests_before + 1, sent_before + len(OBJECT_BYTES))


def test_expired_presigned_url_is_refused_as_expired(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey
) -> None:
    get_url = _get_url(store, reader, expires_s=1)
    head_url = _head_url(store, reader, expires_s=1)

    def refused() -> Answer | None:
        answer = _send("GET", get_url)
        return answer if answer.status != 200 else None

    expired = waiting.wait_until_sync(
        refused, timeout=10.0, what="a GET presigned for 1 s is refused once past its expiry"
    )

    assert expired is not None  # wait_until_sync returns only a truthy answer
    assert expired.error() == (403, "AccessDenied", "Request has expired")

    def head_refused() -> Answer | None:  # signed a moment later: it may expire a second later
        answer = _send("HEAD", head_url)
        return answer if answer.status != 200 else None

    head = waiting.wait_until_sync(
        head_refused, timeout=10.0, what="a HEAD presigned for 1 s is refused past its expiry"
    )
    assert head is not None
    assert (head.status, head.body) == (403, b"")


def test_presigned_url_with_the_wrong_secret_is_refused(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey
) -> None:
    forged = objectstore.AccessKey(reader.access_key_id, "not-the-secret")

    assert _send("GET", _get_url(store, forged)).error()[:2] == (403, "SignatureDoesNotMatch")
    assert _send("HEAD", _head_url(store, forged)).status == 403


def test_presigned_url_of_an_unknown_key_is_refused(store: objectstore.ObjectStore) -> None:
    stranger = objectstore.AccessKey("AKIAMADEUPKEY0000000", "made-up")

    assert _send("GET", _get_url(store, stranger)).error()[:2] == (403, "InvalidAccessKeyId")
    assert _send("HEAD", _head_url(store, stranger)).status == 403


def test_presign_for_one_method_is_refused_for_another(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey
) -> None:
    get_as_head = _send("HEAD", _get_url(store, reader))
    head_as_get = _send("GET", _head_url(store, reader))

    assert (get_as_head.status, get_as_head.body) == (403, b"")
    assert head_as_get.error()[:2] == (403, "SignatureDoesNotMatch")


def test_presign_for_one_object_does_not_open_another(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey
) -> None:
    store.put_object(BUCKET, "iris/other.bin", b"other weights")
    other = f"/{BUCKET}/iris/other.bin?"

    edited = _send("GET", _get_url(store, reader).replace(f"/{BUCKET}/{OBJECT}?", other))

    assert edited.error()[:2] == (403, "SignatureDoesNotMatch")
    assert b"other weights" not in edited.body
    edited_head = _head_url(store, reader).replace(f"/{BUCKET}/{OBJECT}?", other)
    assert _send("HEAD", edited_head).status == 403


def test_presigned_url_with_an_edited_query_is_refused(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey
) -> None:
    url = _get_url(store, reader)

    answer = _send("GET", url.replace("X-Amz-Expires=60", "X-Amz-Expires=600"))

    assert answer.error()[:2] == (403, "SignatureDoesNotMatch")


def test_presigned_head_by_a_user_without_get_object_is_denied(
    store: objectstore.ObjectStore,
) -> None:
    lister = store.create_user("presign-lister", policy=LIST_ONLY)

    head = _send("HEAD", _head_url(store, lister))

    assert (head.status, head.body) == (403, b"")
    assert _send("GET", _get_url(store, lister)).error()[:2] == (403, "AccessDenied")


def test_presign_valid_for_more_than_a_week_is_malformed(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey
) -> None:
    answer = _send("GET", _get_url(store, reader, expires_s=604801))

    assert answer.error()[:2] == (400, "AuthorizationQueryParametersError")


def test_presigned_url_with_an_authorization_header_too_is_refused(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey
) -> None:
    answer = _send("GET", _get_url(store, reader), headers={"Authorization": "AWS4-HMAC-SHA256"})

    assert answer.error()[:2] == (400, "InvalidArgument")
