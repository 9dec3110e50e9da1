"""Cache validation of the spec's own values (issue 14): the source URI needs a download path,
`modelSize` must be positive; both checked on create and when the value changes."""

from __future__ import annotations

import pytest

from localcache.api import storage
from localcache.webhooks import validation
from tests.unit.webhooks.test_validation import lmc, lmnc, messages, snapshot

SCHEMES = "gs://, s3://, hdfs://, webhdfs://, hf://, modelscope://, oci://, http://, https://"


def test_a_file_uri_is_denied_unless_the_controller_allows_it() -> None:
    uri = "file:///var/run/secrets/kubernetes.io/serviceaccount"
    for cache in (lmc("m", uri), lmnc("m", uri)):
        found = validation.validate_write(cache, snapshot=snapshot())
        assert [v.field for v in found] == ["spec.sourceModelUri"]
        allowed = snapshot(allow_file_uris=True)
        assert validation.validate_write(cache, snapshot=allowed) == []


@pytest.mark.parametrize("uri", ["my-model", "ftp://host/model"])
def test_a_uri_without_a_download_path_is_denied_listing_the_schemes(uri: str) -> None:
    for cache in (lmc("m", uri), lmnc("m", uri)):
        found = validation.validate_write(cache, snapshot=snapshot())
        assert [v.field for v in found] == ["spec.sourceModelUri"]
        assert f"no download path supports {uri!r}" in messages(found)[0]
        assert f"supported schemes are {SCHEMES}" in messages(found)[0]


def test_a_storage_container_for_download_jobs_makes_a_scheme_supported() -> None:
    ftp = storage.ClusterStorageContainer.model_validate(
        {
            "metadata": {"name": "ftp"},
            "spec": {
                "container": {"image": "ftp-fetcher"},
                "supportedUriFormats": [{"prefix": "ftp://"}],
                "workloadType": storage.WORKLOAD_LOCAL_MODEL_DOWNLOAD_JOB,
            },
        }
    )
    cache = lmc("m", "ftp://host/model")
    assert validation.validate_write(cache, snapshot=snapshot(storage_containers=[ftp])) == []


def test_an_unchanged_unsupported_uri_never_blocks_an_update() -> None:
    """A container deleted later must not block finalizer or label updates."""
    old = lmc("m", "ftp://host/model")
    new = lmc("m", "ftp://host/model", groups=("gpu1", "gpu2"))
    assert validation.validate_write(new, old=old, snapshot=snapshot(old)) == []


@pytest.mark.parametrize("size", ["-1Gi", "0", "-200Gi", "0Mi"])
def test_a_model_size_that_is_not_positive_is_denied(size: str) -> None:
    for cache in (lmc("m", size=size), lmnc("m", size=size)):
        found = validation.validate_write(cache, snapshot=snapshot())
        assert messages(found) == [f"spec.modelSize: must be greater than 0, got {size}"]


def test_an_update_to_a_non_positive_size_is_denied_but_an_unchanged_one_is_not() -> None:
    old = lmc("m", size="1Gi")
    found = validation.validate_write(lmc("m", size="-1Gi"), old=old, snapshot=snapshot(old))
    assert [v.field for v in found] == ["spec.modelSize"]
    legacy = lmc("m", size="0")
    new = lmc("m", size="0", groups=("gpu1", "gpu2"))
    assert validation.validate_write(new, old=legacy, snapshot=snapshot(legacy)) == []


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("s3://bucket/" + "k" * 900_000, "is 900012 characters long, more than 2048"),
        ("http://[::1", "does not parse as a URL"),
        ("gs://bucket/two words", "holds ' ' at 15"),
    ],
)
def test_a_malformed_uri_is_denied_naming_the_field(uri: str, says: str) -> None:
    for cache in (lmc("m", uri), lmnc("m", uri)):
        found = validation.validate_write(cache, snapshot=snapshot())
        assert [v.field for v in found] == ["spec.sourceModelUri"]
        assert says in messages(found)[0]
        assert len(messages(found)[0]) < 400  # the URI is quoted clipped, never whole
