"""ObjectKey formats and parses "ns/name" and "name"."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localcache.runtime.keys import ObjectKey

_names = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?", fullmatch=True)


@given(namespace=st.one_of(st.just(""), _names), name=_names)
def test_object_key_round_trips_through_its_string(namespace: str, name: str) -> None:
    key = ObjectKey(namespace, name)
    assert ObjectKey.parse(str(key)) == key


def test_cluster_scoped_key_is_the_bare_name() -> None:
    assert str(ObjectKey("", "node-1")) == "node-1"
    assert str(ObjectKey("team-a", "iris")) == "team-a/iris"


@pytest.mark.parametrize("text", ["/x", "ns/", "a/b/c"])
def test_malformed_keys_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="not an object key"):
        ObjectKey.parse(text)


def test_key_of_an_object_reads_its_metadata() -> None:
    assert ObjectKey.of({"metadata": {"name": "n", "namespace": "ns"}}) == ObjectKey("ns", "n")
    assert ObjectKey.of({"metadata": {"name": "n"}}) == ObjectKey("", "n")
