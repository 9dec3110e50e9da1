"""The origin side of a cross-scope proof (`download.s3origin`): how the pod's environment
becomes an S3 client (as KServe's storage initializer reads it), how a model's objects map to
its folder paths, and what the presigned proof carries.

Listing runs against the test object store (moto, credentials enforced); the presigned HEADs
are only inspected here, never run (the serving agent runs them).
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcache.api import originpaths, peer
from localcache.download import peersources, s3origin
from tests.support import objectstore

NONCE = "lc-" + "5" * 32

BUCKET = "models"
ROOT_BUCKET = "flat"
OBJECTS = {
    "iris/model.joblib": b"weights",
    "iris/meta/config.json": b"{}",
    "iris/meta/": b"",  # a "directory" object, as some tools write them
    "single/weights.bin": b"w",
}
NO_S3: dict[str, object] = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Action": "iam:GetUser", "Resource": "*"},
    ],
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[objectstore.ObjectStore]:
    log = tmp_path_factory.mktemp("objectstore") / "objectstore.log"
    with objectstore.ObjectStore(log_path=log).start() as started:
        started.create_bucket(BUCKET)
        for key, data in OBJECTS.items():
            started.put_object(BUCKET, key, data)
        started.create_bucket(ROOT_BUCKET)
        for key in ("a.bin", "sub/", "sub/b.bin"):
            started.put_object(ROOT_BUCKET, key, b"x")
        yield started


@pytest.fixture(scope="module")
def reader(store: objectstore.ObjectStore) -> objectstore.AccessKey:
    return store.create_user("reader")


def _origin(store: objectstore.ObjectStore, key: objectstore.AccessKey) -> s3origin.S3Origin:
    return s3origin.S3Origin.from_env(store.s3_env(key))


def _use_origin(error: pytest.ExceptionInfo[peersources.FetchError]) -> str:
    assert error.value.use_origin, str(error.value)
    return str(error.value)


# ---- settings: the environment as the storage initializer reads it (no network) ----------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {
                "AWS_ENDPOINT_URL": "http://minio:9000",
                "AWS_DEFAULT_REGION": "eu-west-1",
                "S3_USER_VIRTUAL_BUCKET": "true",
                "S3_VERIFY_SSL": "0",
            },
            ("http://minio:9000", "eu-west-1", True, False),
        ),
        (
            {
                "S3_ENDPOINT": "minio:9000",
                "S3_USE_HTTPS": "0",
                "AWS_REGION": "eu-north-1",
                "S3_USER_VIRTUAL_BUCKET": "1",
                "S3_VERIFY_SSL": "false",
            },
            ("http://minio:9000", "eu-north-1", True, False),
        ),
        (
            {"S3_ENDPOINT": "s3.example.com", "S3_USER_VIRTUAL_BUCKET": "false"},
            ("https://s3.example.com", "us-east-1", False, True),
        ),
        ({}, (None, "us-east-1", False, True)),
    ],
    ids=["aws-endpoint-url", "s3-endpoint-http", "s3-endpoint-https", "aws-default"],
)
def test_settings_follow_the_storage_initializers_environment(
    env: dict[str, str], expected: tuple[str | None, str, bool, bool]
) -> None:
    settings = s3origin.S3Settings.from_env(env)

    assert (
        settings.endpoint_url,
        settings.region,
        settings.virtual_hosted,
        settings.verify,
    ) == expected


def test_a_storage_config_entry_supplies_the_origin_over_the_environment() -> None:
    entry = {
        "type": "s3",
        "access_key_id": "AKIACONFIG",
        "secret_access_key": "config-secret",
        "endpoint_url": "http://store.tenant:9000",
        "region": "ap-south-1",
        "bucket": "models",
    }
    env = {
        "STORAGE_CONFIG": json.dumps(entry),
        "STORAGE_OVERRIDE_CONFIG": json.dumps({"region": "eu-central-1"}),
        "AWS_ACCESS_KEY_ID": "AKIAENV",
        "AWS_SECRET_ACCESS_KEY": "env-secret",
        "AWS_ENDPOINT_URL": "http://elsewhere:9000",
    }

    settings = s3origin.S3Settings.from_env(env)

    assert settings.access_key_id == "AKIACONFIG"
    assert settings.secret_access_key == "config-secret"
    assert settings.endpoint_url == "http://store.tenant:9000"
    assert settings.region == "eu-central-1"
    assert "secret" not in repr(settings)
    assert "AKIACONFIG" not in repr(settings)


def test_a_storage_config_entry_of_another_type_leaves_the_environment() -> None:
    env = {"STORAGE_CONFIG": json.dumps({"type": "hdfs", "endpoint_url": "http://x:1"})}

    assert s3origin.S3Settings.from_env(env).endpoint_url is None


@pytest.mark.parametrize(
    "env",
    [
        {"awsAnonymousCredential": "True"},
        {"STORAGE_CONFIG": json.dumps({"type": "s3", "anonymous": "true"})},
        {"STORAGE_CONFIG": json.dumps({"type": "s3", "anonymous": True})},
        {"STORAGE_CONFIG": "{not json"},
        {"AWS_ENDPOINT_URL": "not a url"},
    ],
    ids=["anonymous-env", "anonymous-config", "anonymous-config-bool", "bad-json", "bad-url"],
)
def test_settings_that_cannot_prove_use_the_origin(env: dict[str, str]) -> None:
    with pytest.raises(peersources.FetchError) as error:
        s3origin.S3Origin.from_env(env)

    _use_origin(error)


def test_the_client_signs_sigv4_path_style_with_bounded_timeouts_and_retries() -> None:
    env = {"AWS_ENDPOINT_URL": "http://minio:9000", "AWS_ACCESS_KEY_ID": "AKIA"}
    settings = s3origin.S3Settings.from_env({**env, "AWS_SECRET_ACCESS_KEY": "s"})

    meta = settings.client().meta

    assert (meta.endpoint_url, meta.region_name) == ("http://minio:9000", "us-east-1")
    assert meta.config.signature_version == "s3v4"
    assert meta.config.s3 == {"addressing_style": "path"}
    assert (meta.config.connect_timeout, meta.config.read_timeout) == (5.0, 30.0)
    assert meta.config.retries["mode"] == "standard"
    assert meta.config.retries["total_max_attempts"] == 4  # the first and 3 retries


@pytest.mark.parametrize(
    "uri",
    ["s3:/models/iris", "gs://models/iris", "s3:///iris", "s3://models/" + "x" * peer.MAX_URI],
)
def test_parse_uri_refuses_what_is_not_an_s3_uri(uri: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        originpaths.parse_s3(uri)


# ---- listing: the storage initializer's folder paths --------------------------------------


@pytest.mark.parametrize(
    ("uri", "paths"),
    [
        (
            f"s3://{BUCKET}/iris",
            {"model.joblib": "iris/model.joblib", "meta/config.json": "iris/meta/config.json"},
        ),
        (
            f"s3://{BUCKET}/iris/",
            {"model.joblib": "iris/model.joblib", "meta/config.json": "iris/meta/config.json"},
        ),
        (f"s3://{BUCKET}/single/weights.bin", {"weights.bin": "single/weights.bin"}),
        (f"s3://{ROOT_BUCKET}", {"a.bin": "a.bin", "sub/b.bin": "sub/b.bin"}),
    ],
    ids=["prefix", "prefix-slash", "single-object", "bucket-root"],
)
def test_objects_map_to_the_storage_initializers_folder_paths(
    store: objectstore.ObjectStore,
    reader: objectstore.AccessKey,
    uri: str,
    paths: dict[str, str],
) -> None:
    objects = _origin(store, reader).objects(uri)

    assert {o.path: o.key for o in objects} == paths


def test_an_empty_listing_uses_the_origin(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey
) -> None:
    with pytest.raises(peersources.FetchError) as error:
        _origin(store, reader).objects(f"s3://{BUCKET}/nothing-here")

    assert "no object under" in _use_origin(error)


@pytest.mark.parametrize(
    ("who", "bucket", "said"),
    [
        ("no-permission", BUCKET, "AccessDenied (HTTP 403)"),
        ("wrong-secret", BUCKET, "SignatureDoesNotMatch (HTTP 403)"),
        ("reader", "no-such-bucket", "NoSuchBucket (HTTP 404)"),
    ],
)
def test_a_listing_the_origin_refuses_uses_the_origin(
    store: objectstore.ObjectStore,
    reader: objectstore.AccessKey,
    who: str,
    bucket: str,
    said: str,
) -> None:
    key = reader
    if who == "no-permission":
        key = store.create_user("no-s3", policy=NO_S3)
    elif who == "wrong-secret":
        key = objectstore.AccessKey(reader.access_key_id, "not-the-secret")

    with pytest.raises(peersources.FetchError) as error:
        _origin(store, key).objects(f"s3://{bucket}/iris")

    reason = _use_origin(error)
    assert said in reason
    assert key.secret_access_key not in reason


def test_no_credentials_at_all_use_the_origin(
    store: objectstore.ObjectStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in list(os.environ):  # botocore's default chain finds nothing, asks no IMDS
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    origin = s3origin.S3Origin.from_env({"AWS_ENDPOINT_URL": store.endpoint})

    with pytest.raises(peersources.FetchError) as error:
        origin.objects(f"s3://{BUCKET}/iris")

    assert "credentials" in _use_origin(error).lower()


# ---- the proof: presigned HEADs, never a credential ---------------------------------------


def test_the_proof_has_one_presigned_head_per_object_valid_60_s_without_the_secret(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey
) -> None:
    uri = f"s3://{BUCKET}/iris"
    origin = _origin(store, reader)
    objects = origin.objects(uri)

    proof = origin.proof(uri, objects, NONCE)

    assert (proof.uri, proof.nonce) == (uri, NONCE)
    assert sorted(h.path for h in proof.heads) == ["meta/config.json", "model.joblib"]
    for head in proof.heads:
        url = urllib.parse.urlsplit(head.url)
        query = urllib.parse.parse_qs(url.query)
        assert f"{url.scheme}://{url.netloc}" == store.endpoint
        assert urllib.parse.unquote(url.path) == f"/{BUCKET}/iris/{head.path}"
        assert query["X-Amz-Expires"] == [str(peer.PROOF_EXPIRES_S)] == ["60"]
        assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
        assert query["X-Amz-Credential"][0].startswith(reader.access_key_id + "/")
        # the serving node's nonce is signed: the presign proves nothing to another node
        assert query["X-Amz-SignedHeaders"] == ["host;if-none-match;x-amz-checksum-mode"]
    wire = proof.model_dump_json(by_alias=True)
    assert reader.secret_access_key not in wire
    assert peer.ProofRequest.model_validate_json(wire) == proof
