"""What the controllers read from their stores: a cache whose URI would push every
LocalModelNode of its groups past etcd's size limit (security review finding 5: two 900 KB
URIs, and no cache of any tenant reached those nodes again) is left out, logged once with its
key; the other caches of the same group still reach the node."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from localcache.api import modelcache
from localcache.controllers import state
from localcache.runtime import store

Obj = dict[str, Any]
NODE = "node-1"


def _namespace_cache(name: str, uri: str, rv: str = "1") -> Obj:
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "LocalModelNamespaceCache",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"u-{name}",
            "resourceVersion": rv,
        },
        "spec": {"sourceModelUri": uri, "modelSize": "1Gi", "nodeGroups": ["gpu"]},
    }


def _stores(*caches: Obj) -> state.Stores:
    empty = store.Store().view()
    namespace_caches, nodes, groups = store.Store(), store.Store(), store.Store()
    for cache in caches:
        namespace_caches.upsert(cache)
    nodes.upsert(
        {"metadata": {"name": NODE, "labels": {"pool": "gpu"}, "uid": "n", "resourceVersion": "1"}}
    )
    groups.upsert(
        {
            "metadata": {"name": "gpu", "uid": "g", "resourceVersion": "1"},
            "spec": {
                "storageLimit": "100Gi",
                "persistentVolumeSpec": {
                    "hostPath": {"path": "/models"},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "pool", "operator": "In", "values": ["gpu"]}
                                    ]
                                }
                            ]
                        }
                    },
                },
                "persistentVolumeClaimSpec": {},
            },
        }
    )
    return state.Stores(
        caches=empty,
        namespace_caches=namespace_caches.view(),
        nodes=nodes.view(),
        local_model_nodes=empty,
        node_groups=groups.view(),
        persistent_volumes=empty,
        persistent_volume_claims=empty,
        inference_services=None,
    )


@pytest.mark.parametrize("extra", [1, 900_000])
def test_a_cache_with_a_uri_over_the_limit_never_reaches_a_local_model_node(extra: int) -> None:
    long_uri = "s3://bucket/" + "k" * (
        modelcache.MAX_SOURCE_URI_LENGTH - len("s3://bucket/") + extra
    )
    reader = state.StateReader(
        _stores(_namespace_cache("good", "s3://bucket/good"), _namespace_cache("huge", long_uri))
    )
    with structlog.testing.capture_logs() as logs:
        desired = reader.snapshot().desired_entries(NODE)
        reader.snapshot()  # read again: logged once per resourceVersion
    assert [e["modelName"] for e in desired.entries.values()] == ["good"]
    refused = [e for e in logs if e["event"] == "invalid_object_ignored"]
    assert len(refused) == 1
    assert (refused[0]["name"], refused[0]["namespace"]) == ("huge", "team-a")
    assert f"more than {modelcache.MAX_SOURCE_URI_LENGTH}" in refused[0]["error"]
    assert len(refused[0]["error"]) < 200  # the URI itself is never logged


def test_a_uri_at_the_limit_is_placed() -> None:
    uri = "s3://bucket/" + "k" * (modelcache.MAX_SOURCE_URI_LENGTH - len("s3://bucket/"))
    reader = state.StateReader(_stores(_namespace_cache("edge", uri)))
    desired = reader.snapshot().desired_entries(NODE)
    assert [e["sourceModelUri"] for e in desired.entries.values()] == [uri]
