"""Which source URIs have a download path: the built-in schemes and ClusterStorageContainers."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.api import storage
from localcache.caching import uris


def csc(
    name: str,
    *formats: dict[str, str],
    workload: str | None = storage.WORKLOAD_LOCAL_MODEL_DOWNLOAD_JOB,
    disabled: bool | None = None,
) -> storage.ClusterStorageContainer:
    obj: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {"container": {"image": "x"}, "supportedUriFormats": list(formats)},
    }
    if workload is not None:
        obj["spec"]["workloadType"] = workload
    if disabled is not None:
        obj["disabled"] = disabled
    return storage.ClusterStorageContainer.model_validate(obj)


@pytest.mark.parametrize(
    "uri",
    [
        "gs://bucket/model",
        "s3://bucket/model",
        "hdfs://nn/model",
        "webhdfs://nn/model",
        "hf://org/model",
        "modelscope://org/model",
        "oci://registry/model:1",
        "http://host/model.tgz",
        "https://account.blob.core.windows.net/c/model",
    ],
)
def test_schemes_of_the_storage_initializer_are_supported(uri: str) -> None:
    assert uris.supported(uri)


@pytest.mark.parametrize(
    "uri",
    ["my-model", "ftp://host/model", "/mnt/models/iris", "GS://bucket/m", "gs://", "", "s3:/b/m"],
)
def test_other_uris_have_no_download_path(uri: str) -> None:
    assert not uris.supported(uri)


def test_file_uris_are_refused_unless_allowed() -> None:
    """Issue 13 risk 4: in a download pod `file:///var/run/secrets/…` copies the pod's token
    into a shared folder; only demo nodes (no real pods) allow file://."""
    token = "file:///var/run/secrets/kubernetes.io/serviceaccount"
    assert not uris.supported(token)
    assert "file://" not in uris.describe_supported()
    assert uris.supported(token, allow_file=True)
    assert "file://" in uris.describe_supported(allow_file=True)


def test_a_download_job_storage_container_makes_a_uri_supported() -> None:
    containers = [csc("by-prefix", {"prefix": "ftp://"}), csc("by-regex", {"regex": "^custom:"})]
    assert uris.supported("ftp://host/model", containers)
    assert uris.supported("custom:model", containers)
    assert uris.claimed_by("custom:model", containers) == "by-regex"
    assert not uris.supported("other://x", containers)


def test_disabled_init_container_and_broken_storage_containers_claim_nothing() -> None:
    containers = [
        csc("off", {"prefix": "ftp://"}, disabled=True),
        csc("init", {"prefix": "ftp://"}, workload=storage.WORKLOAD_INIT_CONTAINER),
        csc("default-kind", {"prefix": "ftp://"}, workload=None),
        csc("bad", {"regex": "("}),
    ]
    assert not uris.supported("ftp://host/model", containers)


def test_the_message_lists_every_scheme() -> None:
    text = uris.describe_supported()
    assert all(f"{scheme}://" in text for scheme in uris.SUPPORTED_SCHEMES)


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("s3://bucket/" + "k" * uris.MAX_LENGTH, f"more than {uris.MAX_LENGTH}"),
        ("http://[::1/model", "does not parse as a URL: Invalid IPv6 URL"),
        ("https://host:port/model", "does not parse as a URL: Port could not be cast"),
        ("https:///model", "names no host"),
        ("gs://bucket/my model", "holds ' ' at 14: percent-encode it"),
        ("hf://org/model\n", "holds '\\n' at 14"),
        ("s3://bucket/\x00", "holds '\\x00' at 12"),
    ],
)
def test_a_malformed_uri_says_why(uri: str, reason: str) -> None:
    """Security review finding 5 (a 900 KB URI wedged every LocalModelNode of its groups) and
    issue 20's URIs that do not parse."""
    found = uris.malformed(uri)
    assert found is not None
    assert reason in found


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/" + "k" * (uris.MAX_LENGTH - len("s3://bucket/")),
        "hf://org/model",
        "https://[2001:db8::1]:8443/m",
        "gs://bucket/a%20b",
        "oci://registry.example/model:tag",
    ],
)
def test_a_wellformed_uri_passes(uri: str) -> None:
    assert uris.malformed(uri) is None
