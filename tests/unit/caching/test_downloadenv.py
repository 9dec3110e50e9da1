"""`spec.download` (issue 21): the Hugging Face variables KServe sets, precedence (cache over
node group over defaults), credentials never replaced, and who may set which names."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.api import download
from localcache.caching import downloadenv


def _spec(*env: dict[str, Any], **resources: Any) -> download.DownloadSpec:
    return download.DownloadSpec.model_validate(
        {"env": list(env), **({"resources": resources} if resources else {})}
    )


BASE: dict[str, Any] = {
    "name": "c",
    "env": [
        {"name": "FROM_TEMPLATE", "value": "t"},
        {"name": "HF_XET_HIGH_PERFORMANCE", "value": "0"},
    ],
    "resources": {
        "requests": {"cpu": "100m", "memory": "100Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    },
}


def test_the_hugging_face_defaults_are_added_unless_the_template_sets_them() -> None:
    out = downloadenv.apply(BASE, [])
    assert out["env"] == [
        {"name": "FROM_TEMPLATE", "value": "t"},
        {"name": "HF_XET_HIGH_PERFORMANCE", "value": "0"},  # the template's own wins
        {"name": "HF_HUB_ENABLE_HF_TRANSFER", "value": "1"},
        {"name": "HF_XET_NUM_CONCURRENT_RANGE_GETS", "value": "8"},
    ]
    assert out["resources"] == BASE["resources"]
    assert BASE["env"][1]["value"] == "0", "the template is not changed"


def test_the_cache_wins_over_the_node_group_which_wins_over_the_defaults() -> None:
    group = _spec(
        {"name": "HF_HUB_DISABLE_XET", "value": "0"},
        {"name": "FROM_TEMPLATE", "value": "group"},
        limits={"memory": "4Gi"},
        requests={"memory": "1Gi"},
    )
    cache = _spec(
        {"name": "HF_HUB_DISABLE_XET", "value": "1"},
        {"name": "TOKEN_FILE", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        limits={"memory": "16Gi"},
    )
    out = downloadenv.apply(BASE, [group, cache])
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in out["env"]}
    assert env["HF_HUB_DISABLE_XET"] == "1"
    assert env["FROM_TEMPLATE"] == "group"
    assert env["TOKEN_FILE"] == {"secretKeyRef": {"name": "s", "key": "k"}}, "by reference"
    assert [e["name"] for e in out["env"]].count("HF_HUB_DISABLE_XET") == 1
    assert out["resources"] == {
        "requests": {"cpu": "100m", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "16Gi"},
    }


def test_credential_variables_are_never_replaced() -> None:
    layer = _spec(
        {"name": "AWS_SECRET_ACCESS_KEY", "value": "mine"},
        {"name": "CUSTOM_KEY_NAME", "value": "mine"},
        {"name": "example.com-headers", "value": "{}"},
    )
    out = downloadenv.apply(BASE, [layer], injected=["CUSTOM_KEY_NAME"])
    names = {e["name"] for e in out["env"]}
    assert not names & {"AWS_SECRET_ACCESS_KEY", "CUSTOM_KEY_NAME", "example.com-headers"}


@pytest.mark.parametrize(
    "name",
    ["AWS_ACCESS_KEY_ID", "S3_ENDPOINT", "AZURE_CLIENT_SECRET", "HF_TOKEN", "STORAGE_CONFIG",
     "GOOGLE_APPLICATION_CREDENTIALS", "host-headers", "awsAnonymousCredential", "HOME"],
)  # fmt: skip
def test_the_webhook_refuses_credential_names_naming_the_field(name: str) -> None:
    spec = _spec({"name": "OK_NAME", "value": "1"}, {"name": name, "value": "x"})
    assert downloadenv.violations(spec, field="spec.download", tenant=False) == [
        ("spec.download.env[1].name", f"{name} is set by localcache for credentials")
    ]


def test_a_namespace_cache_may_set_only_download_tuning_variables() -> None:
    """A tenant's download may be one every cache of the URI reuses: no redirection."""
    tuning = ["HF_HUB_DISABLE_XET", "HF_XET_CHUNK_CACHE_SIZE_BYTES"]
    ok = _spec(*({"name": name, "value": "1"} for name in tuning))
    assert downloadenv.violations(ok, field="spec.download", tenant=True) == []
    bad = _spec({"name": "HF_ENDPOINT", "value": "https://mirror.example"})
    [(where, why)] = downloadenv.violations(bad, field="spec.download", tenant=True)
    assert where == "spec.download.env[0].name"
    assert "only download tuning variables" in why
    assert "HF_ENDPOINT" in why
    assert downloadenv.violations(bad, field="spec.download", tenant=False) == []
    # the agent applies only tuning names of a namespace cache, whatever got stored
    stored = [v.to_dict() for v in [*(ok.env or []), *(bad.env or [])]]
    layer = downloadenv.tenant_layer(_spec(*stored))
    assert layer is not None
    assert [v.name for v in layer.env or []] == tuning


def test_each_variable_has_one_value_or_one_reference_and_appears_once() -> None:
    ref = {"name": "s", "key": "k"}
    spec = _spec(
        {"name": "A"},
        {"name": "B", "value": "1", "valueFrom": {"secretKeyRef": ref}},
        {"name": "C", "valueFrom": {"secretKeyRef": ref, "configMapKeyRef": ref}},
        {"name": "D", "valueFrom": {"configMapKeyRef": ref}},
        {"name": "D", "value": "again"},
    )
    one = "exactly one of value and valueFrom (with one of secretKeyRef, configMapKeyRef)"
    assert downloadenv.violations(spec, field="spec.download", tenant=False) == [
        ("spec.download.env[0]", one),
        ("spec.download.env[1]", one),
        ("spec.download.env[2]", one),
        ("spec.download.env[4].name", "D is set twice"),
    ]


def test_a_node_groups_references_never_reach_a_namespace_caches_job() -> None:
    """They would resolve in the tenant's namespace, where the tenant chooses the value."""
    group = _spec(
        {"name": "HF_ENDPOINT", "valueFrom": {"configMapKeyRef": {"name": "mirror", "key": "u"}}},
        {"name": "HF_HUB_DISABLE_XET", "value": "1"},
        limits={"memory": "4Gi"},
    )
    layer = downloadenv.literal_layer(group)
    assert layer is not None
    assert [v.name for v in layer.env or []] == ["HF_HUB_DISABLE_XET"]
    assert layer.resources == group.resources
