"""The test object store refuses every request that is not signed by a user it knows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import botocore.exceptions
import pytest

from localcache.devenv import modelserver
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
