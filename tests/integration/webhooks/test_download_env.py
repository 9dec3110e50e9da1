"""`spec.download` through the real apiserver and the validating webhook (issue 21): credential
names are refused naming the field, a namespace cache may set only download tuning names, the
CRD bounds the count and sizes (tenant input), and a valid spec is stored as written."""

from __future__ import annotations

import json
from typing import Any

from localcache.api import download
from tests.integration.webhooks.harness import Harness

DENIED = "denied the request: "


def _with_download(obj: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "spec": {**obj["spec"], "download": spec}}


async def test_credential_names_are_refused_naming_the_field(harness: Harness) -> None:
    await harness.node_group()
    spec = {"env": [{"name": "HF_HUB_DISABLE_XET", "value": "1"},
                    {"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}]}  # fmt: skip
    async with harness.validating():
        cluster = _with_download(harness.cache_obj(harness.name("m"), "hf://org/model"), spec)
        done = await harness.kubectl_create(cluster)
        assert done.returncode != 0
        assert (
            f"{DENIED}spec.download.env[1].name: AWS_SECRET_ACCESS_KEY is set by localcache "
            "for credentials"
        ) in done.stderr


async def test_a_namespace_cache_may_set_only_tuning_names_and_memory(harness: Harness) -> None:
    await harness.node_group()
    async with harness.validating():
        redirect = {"env": [{"name": "HF_ENDPOINT", "value": "https://mirror.example"}]}
        obj = _with_download(harness.cache_obj("m", "hf://org/m", namespaced=True), redirect)
        done = await harness.kubectl_create(obj, harness.namespace)
        assert done.returncode != 0
        assert f"{DENIED}spec.download.env[0].name: a namespace cache may set only" in (done.stderr)
        fine = {
            "env": [
                {"name": "HF_HUB_DISABLE_XET", "value": "1"},
                {"name": "HF_XET_NUM_CONCURRENT_RANGE_GETS",
                 "valueFrom": {"configMapKeyRef": {"name": "tuning", "key": "gets"}}},
            ],
            "resources": {"limits": {"memory": "16Gi"}, "requests": {"memory": "8Gi"}},
        }  # fmt: skip
        obj = _with_download(harness.cache_obj("ok", "hf://org/m", namespaced=True), fine)
        done = await harness.kubectl_create(obj, harness.namespace)
        assert done.returncode == 0, done.stderr
        got = await harness.kubectl(
            "get", "localmodelnamespacecaches", "ok", "-n", harness.namespace, "-o", "json"
        )
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["spec"]["download"] == fine


async def test_the_crd_bounds_what_a_tenant_may_write(harness: Harness) -> None:
    await harness.node_group()
    many = {"env": [{"name": f"HF_XET_V{i}", "value": "1"} for i in range(download.MAX_ENV + 1)]}
    long = {"env": [{"name": "HF_XET_V", "value": "x" * (download.MAX_VALUE + 1)}]}
    for spec, says in ((many, "must have at most 32 items"), (long, "may not be more than 4096")):
        obj = _with_download(harness.cache_obj("m", "hf://org/m", namespaced=True), spec)
        done = await harness.kubectl_create(obj, harness.namespace)
        assert done.returncode != 0
        assert says in done.stderr, done.stderr
