"""localcache's own ConfigMap laid over KServe's (profile with-kserve, `--kserve-config`):
`config.layer_data` and `liveconfig.LiveConfig(..., under=...)`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcache.caching import config, liveconfig
from localcache.runtime import keys, store

KSERVE = keys.ObjectKey("kserve", "inferenceservice-config")
OWN = keys.ObjectKey("localcache", "localcache-config")
NAMES = (str(KSERVE), str(OWN))
PROFILES = Path(__file__).resolve().parents[3] / "manifests" / "profiles"


def cm(key: keys.ObjectKey, version: str, **sections: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": key.namespace, "name": key.name, "resourceVersion": version},
        "data": {name: json.dumps(value) for name, value in sections.items()},
    }


KSERVE_DATA = cm(
    KSERVE,
    "1",
    # a KServe user's own job namespace: localcache-config's wins, so it and the policies agree
    localModel={"enabled": False, "jobNamespace": "team-model-jobs", "fsGroup": 2000},
    storageInitializer={"image": "registry.example/storage-initializer:v0.20.0"},
    credentials={"s3": {"s3Endpoint": "minio.example:9000", "s3UseHttps": "0"}},
)
OWN_DATA = cm(
    OWN,
    "7",
    localModel={"enabled": True, "jobNamespace": "kserve-localmodel-jobs"},
    credentials={"s3": {"s3UseHttps": "1"}},
)


def test_own_keys_win_and_kserve_fills_in_the_rest() -> None:
    data = config.layer_data(KSERVE_DATA["data"], OWN_DATA["data"], names=NAMES)
    parsed = config.parse_config(data)
    assert parsed.local_model.enabled is True
    assert parsed.local_model.job_namespace == "kserve-localmodel-jobs"
    assert parsed.local_model.fs_group == 2000  # KServe's, not set by localcache
    assert parsed.storage_initializer.image == "registry.example/storage-initializer:v0.20.0"
    assert parsed.credentials.s3.s3_endpoint == "minio.example:9000"  # nested: merged key by key
    assert parsed.credentials.s3.s3_use_https == "1"


def test_invalid_json_names_the_configmap_it_is_in() -> None:
    bad = {**KSERVE_DATA["data"], "localModel": "{not json"}
    with pytest.raises(config.ConfigError, match="kserve/inferenceservice-config: localModel"):
        config.layer_data(bad, OWN_DATA["data"], names=NAMES)


def test_live_config_follows_both_configmaps_and_never_needs_kserve_to_write() -> None:
    kserve, own = store.Store(), store.Store()
    kserve.upsert(KSERVE_DATA)
    own.upsert(OWN_DATA)
    live = liveconfig.LiveConfig(
        own.view(), OWN, initial=None, under=liveconfig.Under(kserve.view(), KSERVE)
    )
    first = live()
    assert first is not None
    assert first.storage_initializer.image == "registry.example/storage-initializer:v0.20.0"
    assert first.local_model.enabled is True

    # KServe's user changes the storage initializer: picked up, localcache's keys still win
    kserve.upsert(
        cm(
            KSERVE,
            "2",
            localModel={"enabled": False},
            storageInitializer={"image": "registry.example/storage-initializer:v0.20.1"},
        )
    )
    second = live()
    assert second is not None
    assert second.storage_initializer.image == "registry.example/storage-initializer:v0.20.1"
    assert second.local_model.enabled is True


def test_without_kserve_configmap_own_configmap_and_defaults_apply() -> None:
    own = store.Store()
    own.upsert(OWN_DATA)
    live = liveconfig.LiveConfig(
        own.view(),
        OWN,
        initial=None,
        under=liveconfig.Under(store.Store().view(), KSERVE),
    )
    loaded = live()
    assert loaded is not None
    assert loaded.local_model.job_namespace == "kserve-localmodel-jobs"
    assert loaded.storage_initializer.image == config.parse_config({}).storage_initializer.image


def test_shipped_with_kserve_config_runs_jobs_where_its_policies_look() -> None:
    """manifests/profiles/with-kserve: its localcache-config, laid over KServe's ConfigMap
    (whatever jobNamespace KServe's says), gives the job namespace its policies name."""
    docs = [
        d
        for d in yaml.safe_load_all((PROFILES / "with-kserve" / "localcache.yaml").read_text())
        if d
    ]
    (own,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (binding,) = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicyBinding"
        and d["metadata"]["name"] == "localcache-agent-job-namespaces"
    ]
    (excluded,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    parsed = config.parse_config(config.layer_data(KSERVE_DATA["data"], own["data"], names=NAMES))
    assert parsed.local_model.job_namespace == "kserve-localmodel-jobs"
    assert excluded["values"] == [parsed.local_model.job_namespace]
    assert parsed.storage_initializer.image == "registry.example/storage-initializer:v0.20.0"
