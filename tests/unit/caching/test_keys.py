"""Status keys, storage keys and URI matching: KServe's formulas, bit for bit."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from localcache.caching import keys

# Kubernetes object names (DNS-1123 subdomains) and namespaces (labels): never a "/".
_names = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,30}[a-z0-9])?", fullmatch=True)
_namespaces = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?", fullmatch=True)
_uris = st.text(min_size=1, max_size=60)
_segments = st.text(alphabet=st.characters(blacklist_characters="/"), min_size=1, max_size=20)


# ---------------------------------------------------------------------------- status keys


def test_status_key_is_name_for_cluster_caches() -> None:
    assert keys.status_key("iris", None) == "iris"
    assert keys.status_key("iris", "") == "iris"


def test_status_key_is_namespace_slash_name_for_namespace_caches() -> None:
    assert keys.status_key("ns-model", "team-a") == "team-a/ns-model"


def test_same_name_in_different_namespaces_gives_distinct_keys() -> None:
    found = {keys.status_key("m", ns) for ns in (None, "ns-a", "ns-b")}
    assert found == {"m", "ns-a/m", "ns-b/m"}


@given(name=_names, namespace=st.one_of(st.none(), _namespaces))
def test_status_key_round_trips(name: str, namespace: str | None) -> None:
    assert keys.parse_status_key(keys.status_key(name, namespace)) == (namespace, name)


@given(key=st.text(min_size=1, max_size=40))
def test_parsed_keys_format_back_to_themselves(key: str) -> None:
    try:
        namespace, name = keys.parse_status_key(key)
    except ValueError:
        return
    assert keys.status_key(name, namespace) == key


@pytest.mark.parametrize("bad", ["", "/m", "ns/", "a/b/c", "/"])
def test_malformed_status_keys_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="status key"):
        keys.parse_status_key(bad)


@pytest.mark.parametrize(("name", "namespace"), [("", None), ("a/b", None), ("m", "a/b")])
def test_status_key_refuses_parts_it_could_not_parse_back(name: str, namespace: str | None) -> None:
    with pytest.raises(ValueError, match="not a"):
        keys.status_key(name, namespace)


# --------------------------------------------------------------------------- storage keys


@given(uri=st.text(max_size=200))
def test_storage_key_is_the_truncated_sha256_of_the_raw_uri(uri: str) -> None:
    key = keys.storage_key(uri)
    assert key == hashlib.sha256(uri.encode("utf-8")).hexdigest()[:16]
    assert len(key) == 16
    assert key == key.lower()
    int(key, 16)


def test_storage_key_does_not_normalise() -> None:
    assert keys.storage_key("gs://b/m") != keys.storage_key("gs://b/m/")
    assert keys.storage_key("s3://mybucket/mymodel") == keys.storage_key("s3://mybucket/mymodel")
    assert keys.storage_key("s3://mybucket/mymodel") != keys.storage_key("s3://mybucket/other")


def test_storage_key_of_a_known_uri() -> None:
    # sha256("s3://mybucket/mymodel"), computed independently.
    expected = hashlib.sha256(b"s3://mybucket/mymodel").hexdigest()[:16]
    assert keys.storage_key("s3://mybucket/mymodel") == expected


def test_storage_key_survives_lone_surrogates_like_go_json() -> None:
    assert keys.storage_key("gs://b/\ud800") == keys.storage_key("gs://b/\ufffd")


# ------------------------------------------------------------------------------ URI match

REFERENCE_EXAMPLES = [
    # storage_uri_utils_test.go
    ("gs://bucket/model", "gs://bucket/model", True),
    ("gs://bucket/model/", "gs://bucket/model", True),
    ("gs://bucket/model", "gs://bucket/model/subdir", True),
    ("gs://bucket/model", "gs://bucket/other", False),
    ("gs://bucket/model", "gs://bucket/model-evil", False),
    # local_model_cache_types_test.go
    ("gs://bucket/model", "gs://bucket/model/modelfiles/", True),
    ("gs://bucket/model", "gs://bucket/model/modelfiles/model.pt", True),
    ("gs://bucket/model", "gs://bucket/model2", False),
    ("gs://bucket/model", "gs://bucket/foo", False),
    ("foo:bar:baz", "foo:bar:baz", True),
    ("foo:bar:baz", "foo:bar:bazzzz", False),
    # local_model_namespace_cache_types_test.go
    ("hf://meta-llama/llama-3-instruct", "hf://meta-llama/llama-3-instruct2", False),
    # trailing slashes on either side (reference §2.9, §6.4)
    ("s3://foo", "s3://foo/", True),
    ("s3://foo/", "s3://foo/model1", True),
    ("s3://foo/", "s3://foo", True),
]


@pytest.mark.parametrize(("cached", "requested", "expected"), REFERENCE_EXAMPLES)
def test_reference_uri_examples(cached: str, requested: str, expected: bool) -> None:
    assert keys.match_storage_uri(cached, requested) is expected


@given(uri=_uris)
def test_a_uri_matches_itself_with_or_without_one_trailing_slash(uri: str) -> None:
    assert keys.match_storage_uri(uri, uri)
    assume(not uri.endswith("/"))
    assert keys.match_storage_uri(uri + "/", uri)
    assert keys.match_storage_uri(uri, uri + "/")


@given(cached=_uris, segments=st.lists(_segments, min_size=1, max_size=4))
def test_sub_paths_match(cached: str, segments: list[str]) -> None:
    requested = cached.removesuffix("/") + "/" + "/".join(segments)
    assert keys.match_storage_uri(cached, requested)


@given(cached=_uris, suffix=st.text(min_size=1, max_size=20))
def test_prefix_attacks_do_not_match(cached: str, suffix: str) -> None:
    base = cached.removesuffix("/")
    assume(not suffix.startswith("/"))
    requested = base + suffix
    assume(requested.removesuffix("/") != base)
    assert not keys.match_storage_uri(cached, requested)


@given(cached=_uris, requested=_uris)
def test_a_match_means_equal_or_under_after_trimming(cached: str, requested: str) -> None:
    c, r = cached.removesuffix("/"), requested.removesuffix("/")
    expected = r == c or (len(r) > len(c) and r.startswith(c) and r[len(c)] == "/")
    assert keys.match_storage_uri(cached, requested) is expected


def test_only_one_trailing_slash_is_trimmed() -> None:
    assert not keys.match_storage_uri("gs://b/m//", "gs://b/m")
    # "gs://b/m//" trims to "gs://b/m/": an (empty) sub-path of gs://b/m, as in KServe.
    assert keys.match_storage_uri("gs://b/m", "gs://b/m//")
