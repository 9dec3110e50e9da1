"""The credential table of reference §8.5, case by case, with localcache's spec §2 changes."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcache.api import modelnode
from localcache.caching import config
from localcache.caching import credentials as cred

NS = "team-a"
URI = "s3://bucket/model"
DEFAULTS = config.CredentialsConfig()  # the shipped ConfigMap's key names


def _cfg(section: Mapping[str, Any]) -> config.CredentialsConfig:
    return config.CredentialsConfig.model_validate(section)


def _secret(
    name: str, data: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if annotations:
        meta["annotations"] = dict(annotations)
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": encoded}


def _sa(
    name: str, secrets: list[str], annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"metadata": meta, "secrets": [{"name": s} for s in secrets]}


def _ref(name: str, secret: str, key: str | None = None) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key or name}}}


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _via_sa(
    *secrets: dict[str, Any],
    config: config.CredentialsConfig = DEFAULTS,
    annotations: Mapping[str, str] | None = None,
) -> cred.Injection:
    """Resolve with SA `reader` listing `secrets`, going through plan/secret_names like the
    agent does."""
    request = cred.CredentialRequest(namespace=NS, uri=URI, service_account_name="reader")
    sa = _sa("reader", [s["metadata"]["name"] for s in secrets], annotations)
    fetch = cred.plan(request, config)
    by_name = {s["metadata"]["name"]: s for s in secrets}
    fetched = {n: by_name.get(n) for n in cred.secret_names(fetch, sa)}
    return cred.resolve(request, config, service_account=sa, secrets=fetched)


def _via_storage(
    storage_secret: dict[str, Any] | None,
    *,
    key: str | None,
    parameters: dict[str, str] | None = None,
    uri: str = URI,
    config: config.CredentialsConfig = DEFAULTS,
) -> cred.Injection:
    request = cred.CredentialRequest(
        namespace=NS, uri=uri, has_storage=True, storage_key=key, parameters=parameters
    )
    secrets = {config.storage_spec_secret_name: storage_secret}
    return cred.resolve(request, config, service_account=_sa("default", []), secrets=secrets)


# ---- precedence (§5.1) ---------------------------------------------------------------------
def test_no_service_account_and_no_storage_injects_nothing() -> None:
    request = cred.CredentialRequest(namespace=NS, uri=URI)
    assert cred.plan(request, DEFAULTS) == cred.FetchPlan(namespace=NS)
    assert cred.resolve(request, DEFAULTS, service_account=None, secrets={}) == cred.Injection(
        uri=URI
    )


def test_plan_names_what_to_fetch_for_each_path() -> None:
    sa_only = cred.CredentialRequest(namespace=NS, uri=URI, service_account_name="reader")
    assert cred.plan(sa_only, DEFAULTS) == cred.FetchPlan(
        namespace=NS, service_account="reader", service_account_required=True,
        use_service_account_secrets=True,
    )  # fmt: skip
    keyed = cred.CredentialRequest(namespace=NS, uri=URI, has_storage=True, storage_key="k")
    assert cred.plan(keyed, DEFAULTS) == cred.FetchPlan(
        namespace=NS, storage_secret="storage-config"
    )
    empty_storage = cred.CredentialRequest(namespace=NS, uri=URI, has_storage=True)
    assert cred.plan(empty_storage, DEFAULTS) == cred.FetchPlan(
        namespace=NS, service_account="default", use_service_account_secrets=True
    )
    overrides = cred.CredentialRequest(
        namespace=NS, uri=URI, has_storage=True, parameters={"type": "s3"}
    )
    assert cred.plan(overrides, DEFAULTS).storage_secret == "storage-config"


def test_secret_names_lists_storage_secret_then_the_service_accounts_in_order() -> None:
    fetch = cred.FetchPlan(
        namespace=NS, service_account="reader", storage_secret="storage-config",
        use_service_account_secrets=True,
    )  # fmt: skip
    sa = _sa("reader", ["b", "a", "b", "storage-config"])
    assert cred.secret_names(fetch, sa) == ["storage-config", "b", "a"]
    assert cred.secret_names(fetch, None) == ["storage-config"]
    keyed = cred.FetchPlan(namespace=NS, service_account="reader", storage_secret="s")
    assert cred.secret_names(keyed, sa) == ["s"]


def test_storage_key_wins_over_service_account_secrets_but_the_pod_runs_as_the_sa() -> None:
    request = cred.CredentialRequest(
        namespace=NS, uri=URI, service_account_name="reader", has_storage=True, storage_key="k"
    )
    storage = _secret("storage-config", {"k": json.dumps({"type": "s3"})})
    s3 = _secret("s3", {"AWS_SECRET_ACCESS_KEY": "x"})
    sa = _sa("reader", ["s3"])
    fetch = cred.plan(request, DEFAULTS)
    assert cred.secret_names(fetch, sa) == ["storage-config"]
    out = cred.resolve(request, DEFAULTS, service_account=sa, secrets={"storage-config": storage})
    assert out.env == (_ref("STORAGE_CONFIG", "storage-config", "k"),)
    assert out.service_account_name == "reader"
    assert s3["metadata"]["name"] not in json.dumps(out.env)


# ---- S3 (§5.2.1, §5.4) --------------------------------------------------------------------
def test_s3_secret_with_the_shipped_key_names_is_referenced() -> None:
    out = _via_sa(_secret("s3", {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key"}))
    assert out.env == (_ref("AWS_ACCESS_KEY_ID", "s3"), _ref("AWS_SECRET_ACCESS_KEY", "s3"))
    assert out.volumes == ()
    assert out.service_account_name == "reader"


def test_s3_key_names_come_from_config_and_empty_names_mean_kserve_code_defaults() -> None:
    secret = _secret("s3", {"awsAccessKeyID": "id", "awsSecretAccessKey": "key"})
    assert _via_sa(secret).env == ()  # not S3 under the shipped names
    empty = _cfg({"s3": {"s3AccessKeyIDName": "", "s3SecretAccessKeyName": ""}})
    assert _via_sa(secret, config=empty).env == (
        _ref("AWS_ACCESS_KEY_ID", "s3", "awsAccessKeyID"),
        _ref("AWS_SECRET_ACCESS_KEY", "s3", "awsSecretAccessKey"),
    )
    custom = _cfg({"s3": {"s3AccessKeyIDName": "id", "s3SecretAccessKeyName": "key"}})
    secret = _secret("s3", {"id": "i", "key": "k"})
    assert _via_sa(secret, config=custom).env == (
        _ref("AWS_ACCESS_KEY_ID", "s3", "id"),
        _ref("AWS_SECRET_ACCESS_KEY", "s3", "key"),
    )


def test_s3_secret_annotations_give_every_option_env() -> None:
    annotations = {
        "serving.kserve.io/s3-endpoint": "s3.example.com",
        "serving.kserve.io/s3-usehttps": "0",
        "serving.kserve.io/s3-verifyssl": "0",
        "serving.kserve.io/s3-useanoncredential": "false",
        "serving.kserve.io/s3-region": "eu-west-1",
        "serving.kserve.io/s3-usevirtualbucket": "true",
        "serving.kserve.io/s3-useaccelerate": "true",
        "serving.kserve.io/s3-cabundle": "/etc/ssl/ca.crt",
        "serving.kserve.io/s3-cabundle-configmap": "ca-bundle",
    }
    out = _via_sa(
        _secret("s3", {"AWS_ACCESS_KEY_ID": "i", "AWS_SECRET_ACCESS_KEY": "k"}, annotations)
    )
    assert out.env == (
        _ref("AWS_ACCESS_KEY_ID", "s3", "AWS_ACCESS_KEY_ID"),
        _ref("AWS_SECRET_ACCESS_KEY", "s3", "AWS_SECRET_ACCESS_KEY"),
        _env("S3_USE_HTTPS", "0"),
        _env("S3_ENDPOINT", "s3.example.com"),
        _env("AWS_ENDPOINT_URL", "http://s3.example.com"),
        _env("S3_VERIFY_SSL", "0"),
        _env("awsAnonymousCredential", "false"),
        _env("AWS_DEFAULT_REGION", "eu-west-1"),
        _env("S3_USER_VIRTUAL_BUCKET", "true"),
        _env("S3_USE_ACCELERATE", "true"),
        _env("AWS_CA_BUNDLE", "/etc/ssl/ca.crt"),
        _env("AWS_CA_BUNDLE_CONFIGMAP", "ca-bundle"),
    )


@pytest.mark.parametrize(
    ("endpoint", "use_https", "expected"),
    [
        ("https://minio:9000", None, ("1", "minio:9000", "https://minio:9000")),
        ("http://minio:9000", None, ("0", "minio:9000", "http://minio:9000")),
        ("https://minio:9000", "0", ("1", "minio:9000", "https://minio:9000")),
        ("  minio:9000 ", None, (None, "minio:9000", "https://minio:9000")),
        ("minio:9000", "1", ("1", "minio:9000", "https://minio:9000")),
        ("minio:9000", "0", ("0", "minio:9000", "http://minio:9000")),
    ],
)
def test_s3_endpoint_scheme_decides_use_https_and_endpoint_url(
    endpoint: str, use_https: str | None, expected: tuple[str | None, str, str]
) -> None:
    annotations = {"serving.kserve.io/s3-endpoint": endpoint}
    if use_https is not None:
        annotations["serving.kserve.io/s3-usehttps"] = use_https
    out = _via_sa(_secret("s3", {"AWS_SECRET_ACCESS_KEY": "k"}, annotations))
    https, host, url = expected
    want = [_env("S3_ENDPOINT", host), _env("AWS_ENDPOINT_URL", url)]
    if https is not None:
        want.insert(0, _env("S3_USE_HTTPS", https))
    assert list(out.env[1:]) == want


def test_s3_options_in_secret_data_are_referenced_not_copied() -> None:
    data = {
        "AWS_SECRET_ACCESS_KEY": "k",
        "S3_ENDPOINT": "minio.internal:9000",
        "S3_USE_HTTPS": "0",
        "AWS_DEFAULT_REGION": "us-east-2",
    }
    out = _via_sa(_secret("s3", data))
    assert out.env == (
        _ref("AWS_SECRET_ACCESS_KEY", "s3", "AWS_SECRET_ACCESS_KEY"),
        _ref("S3_USE_HTTPS", "s3"),
        _ref("S3_ENDPOINT", "s3"),
        _env("AWS_ENDPOINT_URL", "http://$(S3_ENDPOINT)"),
        _ref("AWS_DEFAULT_REGION", "s3"),
    )
    assert "minio.internal" not in json.dumps(out.env)


def test_s3_endpoint_with_scheme_in_secret_data_expands_into_the_url() -> None:
    out = _via_sa(_secret("s3", {"AWS_SECRET_ACCESS_KEY": "k", "S3_ENDPOINT": "https://minio"}))
    assert out.env[1:] == (
        _env("S3_USE_HTTPS", "1"),
        _ref("S3_ENDPOINT", "s3"),
        _env("AWS_ENDPOINT_URL", "$(S3_ENDPOINT)"),
    )


@pytest.mark.parametrize(
    ("annotation", "data", "config", "expected"),
    [
        (
            "from-annotation",
            "from-data",
            "from-config",
            _env("AWS_DEFAULT_REGION", "from-annotation"),
        ),
        (None, "from-data", "from-config", _ref("AWS_DEFAULT_REGION", "s3")),
        (None, None, "from-config", _env("AWS_DEFAULT_REGION", "from-config")),
        ("", None, "from-config", _env("AWS_DEFAULT_REGION", "from-config")),
        (None, None, None, None),
    ],
)
def test_s3_option_precedence_is_annotation_then_secret_data_then_config(
    annotation: str | None, data: str | None, config: str | None, expected: dict[str, Any] | None
) -> None:
    secret_data = {"AWS_SECRET_ACCESS_KEY": "k"}
    if data is not None:
        secret_data["AWS_DEFAULT_REGION"] = data
    annotations = {} if annotation is None else {"serving.kserve.io/s3-region": annotation}
    section = {"s3": {"s3Region": config}} if config else {}
    out = _via_sa(
        _secret("s3", secret_data, annotations),
        config=_cfg(section),
    )
    assert list(out.env[1:]) == ([expected] if expected else [])


def test_s3_config_endpoint_anonymous_and_http() -> None:
    section = {
        "s3": {"s3Endpoint": "minio:9000", "s3UseHttps": "0", "s3UseAnonymousCredential": "true"}
    }
    out = _via_sa(
        _secret("s3", {"AWS_SECRET_ACCESS_KEY": "k"}),
        config=_cfg(section),
    )
    assert out.env[1:] == (
        _env("S3_USE_HTTPS", "0"),
        _env("S3_ENDPOINT", "minio:9000"),
        _env("AWS_ENDPOINT_URL", "http://minio:9000"),
        _env("awsAnonymousCredential", "true"),
    )


# ---- IRSA -----------------------------------------------------------------------------------
def test_irsa_service_account_gets_s3_options_from_its_annotations_without_keys() -> None:
    annotations = {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123:role/reader",
        "serving.kserve.io/s3-endpoint": "s3.amazonaws.com",
        "serving.kserve.io/s3-region": "us-west-2",
    }
    out = _via_sa(annotations=annotations)
    assert out.env == (
        _env("S3_ENDPOINT", "s3.amazonaws.com"),
        _env("AWS_ENDPOINT_URL", "https://s3.amazonaws.com"),
        _env("AWS_DEFAULT_REGION", "us-west-2"),
    )
    assert out.service_account_name == "reader"


def test_s3_secret_options_override_irsa_values_in_place() -> None:
    sa_annotations = {
        "eks.amazonaws.com/role-arn": "arn",
        "serving.kserve.io/s3-region": "us-west-2",
        "serving.kserve.io/s3-verifyssl": "1",
    }
    secret = _secret(
        "s3", {"AWS_SECRET_ACCESS_KEY": "k"}, {"serving.kserve.io/s3-region": "eu-central-1"}
    )
    out = _via_sa(secret, annotations=sa_annotations)
    assert out.env == (
        _env("S3_VERIFY_SSL", "1"),
        _env("AWS_DEFAULT_REGION", "eu-central-1"),
        _ref("AWS_SECRET_ACCESS_KEY", "s3", "AWS_SECRET_ACCESS_KEY"),
    )


def test_service_account_without_irsa_or_secrets_injects_nothing_but_runs_the_pod() -> None:
    out = _via_sa(annotations={"serving.kserve.io/s3-region": "x"})
    assert out.env == ()
    assert out.service_account_name == "reader"


def test_azure_workload_identity_service_account_labels_the_pod() -> None:
    out = _via_sa(annotations={"azure.workload.identity/client-id": "c1d2"})
    assert out.pod_labels == {"azure.workload.identity/use": "true"}
    assert _via_sa().pod_labels == {}


# ---- GCS, Azure, HTTPS, HDFS, HF, ModelScope (§5.2.2-10) ----------------------------------
def test_gcs_secret_is_mounted_and_pointed_at() -> None:
    out = _via_sa(_secret("gcs", {"gcloud-application-credentials.json": "{}"}))
    assert out.volumes == ({"name": "user-gcp-sa", "secret": {"secretName": "gcs"}},)
    assert out.volume_mounts == (
        {"name": "user-gcp-sa", "mountPath": "/var/secrets/", "readOnly": True},
    )
    assert out.env == (
        _env("GOOGLE_APPLICATION_CREDENTIALS", "/var/secrets/gcloud-application-credentials.json"),
    )


def test_gcs_credential_file_name_comes_from_config_and_is_mounted_once() -> None:
    config = _cfg({"gcs": {"gcsCredentialFileName": "sa.json"}})
    out = _via_sa(_secret("g1", {"sa.json": "{}"}), _secret("g2", {"sa.json": "{}"}), config=config)
    assert out.volumes == ({"name": "user-gcp-sa", "secret": {"secretName": "g1"}},)
    assert len(out.volume_mounts) == 1
    assert out.env[0] == _env("GOOGLE_APPLICATION_CREDENTIALS", "/var/secrets/sa.json")


def test_azure_legacy_secret_references_the_az_keys() -> None:
    data = {
        "AZ_SUBSCRIPTION_ID": "s",
        "AZ_TENANT_ID": "t",
        "AZ_CLIENT_ID": "c",
        "AZ_CLIENT_SECRET": "x",
    }
    assert _via_sa(_secret("az", data)).env == (
        _ref("AZURE_SUBSCRIPTION_ID", "az", "AZ_SUBSCRIPTION_ID"),
        _ref("AZURE_TENANT_ID", "az", "AZ_TENANT_ID"),
        _ref("AZURE_CLIENT_ID", "az", "AZ_CLIENT_ID"),
        _ref("AZURE_CLIENT_SECRET", "az", "AZ_CLIENT_SECRET"),
    )


def test_azure_secret_references_present_keys_only() -> None:
    data = {"AZURE_CLIENT_ID": "c", "AZURE_CLIENT_SECRET": "x", "AZURE_STORAGE_ACCESS_KEY": "k"}
    assert _via_sa(_secret("az", data)).env == (
        _ref("AZURE_CLIENT_ID", "az"),
        _ref("AZURE_CLIENT_SECRET", "az"),
        _ref("AZURE_STORAGE_ACCESS_KEY", "az"),
    )  # no AZURE_TENANT_ID reference to a key the secret lacks (KServe had one)


def test_azure_token_secret() -> None:
    data = {
        "AZURE_ACCESS_TOKEN": "t",
        "AZURE_ACCESS_EXPIRES_ON_SECONDS": "3600",
        "AZURE_ACCOUNT_NAME": "acct",
        "AZURE_SERVICE_URL": "https://acct.blob.core.windows.net",
    }
    assert _via_sa(_secret("az", data)).env == tuple(_ref(k, "az") for k in data)


def test_azure_storage_access_key_only_secret() -> None:
    out = _via_sa(_secret("az", {"AZURE_STORAGE_ACCESS_KEY": "k"}))
    assert out.env == (_ref("AZURE_STORAGE_ACCESS_KEY", "az"),)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"https-host": "models.example.com", "headers": "Authorization: x"},
         (_ref("models.example.com-headers", "web", "headers"),)),
        ({"https-host": "models.example.com"}, ()),
        ({"headers": "Authorization: x"}, ()),
    ],
)  # fmt: skip
def test_https_headers_are_referenced_under_the_host_env_name(
    data: dict[str, str], expected: tuple[dict[str, Any], ...]
) -> None:
    out = _via_sa(_secret("web", data))
    assert out.env == expected
    assert "Authorization" not in json.dumps(out.env)


def test_hdfs_secret_is_mounted() -> None:
    out = _via_sa(_secret("hdfs", {"HDFS_NAMENODE": "nn:8020", "KERBEROS_KEYTAB": "..."}))
    assert out.volumes == ({"name": "hdfs-secrets", "secret": {"secretName": "hdfs"}},)
    assert out.volume_mounts == (
        {"name": "hdfs-secrets", "mountPath": "/var/secrets/kserve-hdfscreds", "readOnly": True},
    )
    assert out.env == ()


@pytest.mark.parametrize("key", ["HF_TOKEN", "MODELSCOPE_API_TOKEN"])
def test_hub_tokens_are_referenced(key: str) -> None:
    assert _via_sa(_secret("hub", {key: "tok"})).env == (_ref(key, "hub"),)


def test_unrecognised_secrets_are_skipped() -> None:
    assert _via_sa(_secret("other", {"password": "p"})) == cred.Injection(
        uri=URI, service_account_name="reader"
    )


def test_the_first_matching_kind_classifies_a_secret() -> None:
    out = _via_sa(_secret("mixed", {"AWS_SECRET_ACCESS_KEY": "k", "HF_TOKEN": "t"}))
    assert [e["name"] for e in out.env] == ["AWS_SECRET_ACCESS_KEY"]


def test_several_secrets_on_one_service_account_all_contribute() -> None:
    out = _via_sa(
        _secret("s3", {"AWS_SECRET_ACCESS_KEY": "k"}),
        _secret("hf", {"HF_TOKEN": "t"}),
        _secret("hdfs", {"HDFS_NAMENODE": "nn"}),
    )
    assert [e["name"] for e in out.env] == ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN"]
    assert [v["name"] for v in out.volumes] == ["hdfs-secrets"]


# ---- storage-config path (§5.3) ------------------------------------------------------------
MINIO = {"type": "s3", "bucket": "models", "access_key_id": "AKIA", "secret_access_key": "shh"}


def test_storage_key_references_the_storage_config_entry() -> None:
    out = _via_storage(_secret("storage-config", {"minio": json.dumps(MINIO)}), key="minio")
    assert out == cred.Injection(uri=URI, env=(_ref("STORAGE_CONFIG", "storage-config", "minio"),))


def test_storage_parameters_become_override_config() -> None:
    out = _via_storage(
        _secret("storage-config", {"minio": json.dumps(MINIO)}),
        key="minio",
        parameters={"bucket": "other", "region": "eu"},
    )
    assert out.env == (
        _ref("STORAGE_CONFIG", "storage-config", "minio"),
        _env("STORAGE_OVERRIDE_CONFIG", '{"bucket": "other", "region": "eu"}'),
    )


def test_storage_spec_secret_name_comes_from_config() -> None:
    config = _cfg({"storageSpecSecretName": "my-storage"})
    secret = _secret("my-storage", {"minio": json.dumps(MINIO)})
    out = _via_storage(secret, key="minio", config=config)
    assert out.env == (_ref("STORAGE_CONFIG", "my-storage", "minio"),)


def test_storage_type_from_parameters_skips_reading_the_entry() -> None:
    secret = _secret("storage-config", {"raw": "not json at all"})
    out = _via_storage(secret, key="raw", parameters={"type": "s3"})
    assert out.env == (
        _ref("STORAGE_CONFIG", "storage-config", "raw"),
        _env("STORAGE_OVERRIDE_CONFIG", '{"type": "s3"}'),
    )


@pytest.mark.parametrize(
    ("entry", "parameters", "uri", "expected"),
    [
        (MINIO, None, "<scheme-placeholder>://path/to/model", "s3://models/path/to/model"),
        (MINIO, {"bucket": "b2"}, "<scheme-placeholder>://m", "s3://b2/m"),
        ({"type": "hdfs"}, None, "<scheme-placeholder>://user/m", "hdfs://user/m"),
        ({"type": "webhdfs"}, None, "<scheme-placeholder>://m", "webhdfs://m"),
        (MINIO, None, "s3://explicit/m", "s3://explicit/m"),
    ],
)
def test_scheme_placeholder_is_rewritten_from_type_and_bucket(
    entry: dict[str, str], parameters: dict[str, str] | None, uri: str, expected: str
) -> None:
    secret = _secret("storage-config", {"e": json.dumps(entry)})
    assert _via_storage(secret, key="e", parameters=parameters, uri=uri).uri == expected


@pytest.mark.parametrize(
    ("data", "key", "parameters", "uri", "message"),
    [
        ({"other": "{}"}, "minio", None, URI,
         "storage key minio not found in Secret team-a/storage-config"),
        ({"e": '{"type": "hf"}'}, "e", None, URI,
         "storage type must be one of [s3, hdfs, webhdfs]. storage type [hf] is not supported"),
        ({"e": "{not json"}, "e", None, URI,
         "storage key e in Secret team-a/storage-config is not"),
        ({"e": '["s3"]'}, "e", None, URI, "is not a JSON object"),
        ({"e": '{"bucket": "b"}'}, "e", None, URI,
         "unable to determine storage type for storage key e"),
        ({"e": '{"type": "s3"}'}, "e", None, "<scheme-placeholder>://m",
         "format [s3] requires a bucket"),
    ],
)  # fmt: skip
def test_storage_config_errors_name_the_key_and_secret(
    data: dict[str, str], key: str, parameters: dict[str, str] | None, uri: str, message: str
) -> None:
    with pytest.raises(cred.CredentialError) as info:
        _via_storage(_secret("storage-config", data), key=key, parameters=parameters, uri=uri)
    assert message in str(info.value)


def test_missing_storage_config_secret_names_secret_and_namespace() -> None:
    with pytest.raises(cred.CredentialError) as info:
        _via_storage(None, key="minio")
    assert str(info.value) == (
        "Secret team-a/storage-config (storage-config for storage key minio) "
        "not found in namespace team-a"
    )


def test_parameters_without_key_are_honoured_as_overrides() -> None:
    params = {"type": "s3", "endpoint_url": "https://minio", "bucket": "public"}
    out = _via_storage(None, key=None, parameters=params, uri="<scheme-placeholder>://m")
    assert out.uri == "s3://public/m"
    assert out.env == (_env("STORAGE_OVERRIDE_CONFIG", json.dumps(params, sort_keys=True)),)


def test_parameters_without_key_use_the_default_entry_for_their_type() -> None:
    secret = _secret("storage-config", {"default_s3": json.dumps(MINIO), "default": "{}"})
    out = _via_storage(secret, key=None, parameters={"type": "s3"})
    assert out.env == (
        _ref("STORAGE_CONFIG", "storage-config", "default_s3"),
        _env("STORAGE_OVERRIDE_CONFIG", '{"type": "s3"}'),
    )
    untyped = _via_storage(secret, key=None, parameters={"region": "eu"})
    assert untyped.env[0] == _ref("STORAGE_CONFIG", "storage-config", "default")


def test_parameters_without_key_keep_the_service_account_credentials() -> None:
    request = cred.CredentialRequest(
        namespace=NS, uri=URI, service_account_name="reader", has_storage=True,
        parameters={"region": "eu"},
    )  # fmt: skip
    sa = _sa("reader", ["hf"])
    fetched = {"storage-config": None, "hf": _secret("hf", {"HF_TOKEN": "t"})}
    out = cred.resolve(request, DEFAULTS, service_account=sa, secrets=fetched)
    assert out.env == (_ref("HF_TOKEN", "hf"), _env("STORAGE_OVERRIDE_CONFIG", '{"region": "eu"}'))


def test_placeholder_without_any_storage_type_cannot_be_rewritten() -> None:
    with pytest.raises(cred.CredentialError, match="storage type unknown"):
        _via_storage(None, key=None, parameters={"region": "eu"}, uri="<scheme-placeholder>://m")


# ---- errors name what is missing -------------------------------------------------------------
def test_missing_named_service_account_names_it_and_the_namespace() -> None:
    request = cred.CredentialRequest(namespace=NS, uri=URI, service_account_name="reader")
    with pytest.raises(cred.CredentialError) as info:
        cred.resolve(request, DEFAULTS, service_account=None, secrets={})
    assert str(info.value) == "ServiceAccount team-a/reader not found in namespace team-a"


def test_missing_named_service_account_is_an_error_on_the_storage_key_path_too() -> None:
    request = cred.CredentialRequest(
        namespace=NS, uri=URI, service_account_name="reader", has_storage=True, storage_key="k"
    )
    storage = _secret("storage-config", {"k": json.dumps(MINIO)})
    with pytest.raises(cred.CredentialError, match="ServiceAccount team-a/reader not found"):
        cred.resolve(request, DEFAULTS, service_account=None, secrets={"storage-config": storage})


def test_missing_default_service_account_injects_nothing() -> None:
    request = cred.CredentialRequest(namespace=NS, uri=URI, has_storage=True)
    out = cred.resolve(request, DEFAULTS, service_account=None, secrets={})
    assert out == cred.Injection(uri=URI)


def test_missing_secret_listed_by_the_service_account_names_both() -> None:
    request = cred.CredentialRequest(namespace=NS, uri=URI, service_account_name="reader")
    with pytest.raises(cred.CredentialError) as info:
        cred.resolve(request, DEFAULTS, service_account=_sa("reader", ["s3"]), secrets={"s3": None})
    assert str(info.value) == (
        "Secret team-a/s3 (listed by ServiceAccount team-a/reader) not found in namespace team-a"
    )


# ---- no secret value ever leaves the Secret ----------------------------------------------------
_VALUES = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=12, max_size=24)


@settings(max_examples=50, deadline=None)
@given(value=_VALUES, https=st.booleans())
def test_no_secret_value_appears_in_any_injection(value: str, https: bool) -> None:
    scheme = "https://" if https else ""
    secrets = [
        _secret("s3", {"AWS_ACCESS_KEY_ID": value, "AWS_SECRET_ACCESS_KEY": value,
                       "S3_ENDPOINT": f"{scheme}{value}.example", "AWS_CA_BUNDLE": value}),
        _secret("gcs", {"gcloud-application-credentials.json": value}),
        _secret("az", {"AZ_CLIENT_ID": value, "AZ_CLIENT_SECRET": value, "AZ_TENANT_ID": value}),
        _secret("azk", {"AZURE_STORAGE_ACCESS_KEY": value}),
        _secret("web", {"https-host": "models.example.com", "headers": value}),
        _secret("hdfs", {"HDFS_NAMENODE": value, "KERBEROS_KEYTAB": value}),
        _secret("hf", {"HF_TOKEN": value}),
        _secret("ms", {"MODELSCOPE_API_TOKEN": value}),
    ]  # fmt: skip
    out = _via_sa(*secrets, annotations={"eks.amazonaws.com/role-arn": "arn"})
    assert len(out.env) > 10
    assert value not in json.dumps([out.env, out.volumes, out.volume_mounts, out.uri])
    entry = {**MINIO, "secret_access_key": value, "access_key_id": value}
    stored = _via_storage(_secret("storage-config", {"e": json.dumps(entry)}), key="e")
    assert value not in json.dumps([stored.env, stored.uri])


# ---- entries and credential scope --------------------------------------------------------------
def _entry(**fields: Any) -> modelnode.LocalModelInfo:
    return modelnode.LocalModelInfo.model_validate(
        {"sourceModelUri": URI, "modelName": "iris", **fields}
    )


def test_request_for_reads_cluster_entries_in_the_job_namespace() -> None:
    cluster = cred.request_for(_entry(serviceAccountName="reader"), job_namespace="jobs")
    assert cluster == cred.CredentialRequest(
        namespace="jobs", uri=URI, service_account_name="reader"
    )
    scoped = cred.request_for(
        _entry(namespace=NS, storage={"key": "k", "parameters": {"type": "s3"}}),
        job_namespace="jobs",
    )
    assert scoped == cred.CredentialRequest(
        namespace=NS,
        uri=URI,
        has_storage=True,
        storage_key="k",
        parameters={"type": "s3"},
        tenant=True,
    )


def test_credential_scope() -> None:
    def scope(**fields: Any) -> object:
        return cred.credential_scope(cred.request_for(_entry(**fields), job_namespace="jobs"))

    assert scope() is None
    assert scope(modelName="other") is None
    assert scope(namespace=NS) == (NS,), "a tenant's download without credentials is its own"
    assert scope(serviceAccountName="reader") == scope(modelName="b", serviceAccountName="reader")
    assert scope(serviceAccountName="reader") == scope(
        namespace="jobs", serviceAccountName="reader"
    )
    assert scope(serviceAccountName="reader") != scope(namespace=NS, serviceAccountName="reader")
    assert scope(serviceAccountName="reader") != scope(serviceAccountName="writer")
    assert scope(storage={"key": "a"}) != scope(storage={"key": "b"})
    assert scope(storage={}) == scope(serviceAccountName="default")
    assert scope(storage={"key": "a", "parameters": {"x": "1"}}) != scope(storage={"key": "a"})
