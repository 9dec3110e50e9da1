"""inferenceservice-config parsing: KServe's keys and shipped defaults, and errors that name
the section and key instead of crashing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localcache.caching import config

# The relevant part of the ConfigMap KServe ships (config/configmap/inferenceservice.yaml).
SHIPPED = {
    "localModel": json.dumps(
        {
            "enabled": False,
            "jobNamespace": "kserve-localmodel-jobs",
            "defaultJobImage": "kserve/storage-initializer:latest",
            "fsGroup": 1000,
            "jobTTLSecondsAfterFinished": 3600,
            "reconcilationFrequencyInSecs": 60,
            "disableVolumeManagement": False,
        }
    ),
    "storageInitializer": json.dumps(
        {
            "image": "kserve/storage-initializer:latest",
            "memoryRequest": "100Mi",
            "memoryLimit": "1Gi",
            "cpuRequest": "100m",
            "cpuLimit": "1",
            "caBundleConfigMapName": "",
            "caBundleVolumeMountPath": "/etc/ssl/custom-certs",
            "enableDirectPvcVolumeMount": True,
            "enableModelcar": True,
            "cpuModelcar": "10m",
            "memoryModelcar": "15Mi",
            "uidModelcar": 1010,
        }
    ),
    "credentials": json.dumps(
        {
            "storageSpecSecretName": "storage-config",
            "storageSecretNameAnnotation": "serving.kserve.io/storageSecretName",
            "gcs": {"gcsCredentialFileName": "gcloud-application-credentials.json"},
            "s3": {
                "s3AccessKeyIDName": "AWS_ACCESS_KEY_ID",
                "s3SecretAccessKeyName": "AWS_SECRET_ACCESS_KEY",
                "s3Endpoint": "",
                "s3UseHttps": "",
                "s3Region": "",
                "s3VerifySSL": "",
                "s3UseVirtualBucket": "",
                "s3UseAccelerate": "",
                "s3UseAnonymousCredential": "",
                "s3CABundle": "",
            },
        }
    ),
    "ingress": "{not even json: other sections are not ours}",
}


def test_missing_sections_take_kserves_shipped_defaults() -> None:
    parsed = config.parse_config({})
    local = parsed.local_model
    assert local.enabled is False
    assert local.job_namespace == "kserve-localmodel-jobs"
    assert local.default_job_image == "kserve/storage-initializer:latest"
    assert local.fs_group == 1000
    assert local.shared_pvc_import_fs_group is None
    assert local.job_ttl_seconds_after_finished == 3600
    assert local.reconcilation_frequency_in_secs == 60
    assert local.disable_volume_management is False
    assert local.download_retry_backoff_in_secs == 60
    assert local.download_retry_max_backoff_in_secs == 3600
    assert local.download_stall_timeout_in_secs == 600
    init = parsed.storage_initializer
    assert init.image == "kserve/storage-initializer:latest"
    assert init.resources() == {
        "requests": {"cpu": "100m", "memory": "100Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }
    assert init.ca_bundle_volume_mount_path == "/etc/ssl/custom-certs"
    creds = parsed.credentials
    assert creds.storage_spec_secret_name == "storage-config"
    assert creds.storage_secret_name_annotation == "serving.kserve.io/storageSecretName"
    assert creds.gcs.gcs_credential_file_name == "gcloud-application-credentials.json"
    assert creds.s3.s3_access_key_id_name == "AWS_ACCESS_KEY_ID"
    assert creds.s3.s3_secret_access_key_name == "AWS_SECRET_ACCESS_KEY"
    assert creds.s3.s3_endpoint == ""


def test_the_shipped_configmap_parses_to_the_defaults() -> None:
    parsed = config.parse_config(SHIPPED)
    defaults = config.parse_config({})
    assert parsed.local_model == defaults.local_model
    assert parsed.credentials == defaults.credentials
    assert parsed.storage_initializer.enable_modelcar is True
    assert parsed.storage_initializer.uid_modelcar == 1010


def test_every_key_is_read_by_its_kserve_name() -> None:
    parsed = config.parse_config(
        {
            "localModel": json.dumps(
                {
                    "enabled": True,
                    "jobNamespace": "jobs",
                    "defaultJobImage": "img:1",
                    "fsGroup": 2000,
                    "jobTTLSecondsAfterFinished": 0,
                    "reconcilationFrequencyInSecs": 5,
                    "disableVolumeManagement": True,
                    "downloadRetryBackoffInSecs": 10,
                    "downloadRetryMaxBackoffInSecs": 80,
                    "downloadStallTimeoutInSecs": 120,
                    "someFutureKey": {"ignored": True},
                }
            ),
            "storageInitializer": json.dumps(
                {
                    "image": "init:2",
                    "cpuRequest": "200m",
                    "cpuLimit": "2",
                    "memoryRequest": "200Mi",
                    "memoryLimit": "2Gi",
                    "caBundleConfigMapName": "cabundle",
                    "ociModelMode": "fetch",
                }
            ),
            "credentials": json.dumps(
                {
                    "storageSpecSecretName": "my-storage",
                    "s3": {"s3Endpoint": "minio:9000", "s3UseHttps": "0", "s3VerifySSL": "1"},
                    "gcs": {"gcsCredentialFileName": "key.json"},
                }
            ),
        }
    )
    local = parsed.local_model
    assert (local.enabled, local.job_namespace, local.default_job_image) == (True, "jobs", "img:1")
    assert (local.fs_group, local.job_ttl_seconds_after_finished) == (2000, 0)
    assert (local.reconcilation_frequency_in_secs, local.disable_volume_management) == (5, True)
    assert (local.download_retry_backoff_in_secs, local.download_retry_max_backoff_in_secs) == (
        10,
        80,
    )
    assert local.download_stall_timeout_in_secs == 120
    init = parsed.storage_initializer
    assert (init.image, init.cpu_request, init.memory_limit) == ("init:2", "200m", "2Gi")
    assert (init.ca_bundle_config_map_name, init.oci_model_mode) == ("cabundle", "fetch")
    creds = parsed.credentials
    assert creds.storage_spec_secret_name == "my-storage"
    assert (creds.s3.s3_endpoint, creds.s3.s3_use_https, creds.s3.s3_verify_ssl) == (
        "minio:9000",
        "0",
        "1",
    )
    assert creds.s3.s3_access_key_id_name == "AWS_ACCESS_KEY_ID"  # default kept beside others
    assert creds.gcs.gcs_credential_file_name == "key.json"


def test_null_fs_group_means_no_fs_group_but_null_ttl_means_default() -> None:
    local = config.parse_config(
        {"localModel": '{"fsGroup": null, "jobTTLSecondsAfterFinished": null}'}
    ).local_model
    assert local.fs_group is None
    assert local.job_ttl_seconds_after_finished == 3600


def test_shared_pvc_import_fs_group_is_kserves_key_with_no_default() -> None:
    def parsed(body: str) -> int | None:
        return config.parse_config({"localModel": body}).local_model.shared_pvc_import_fs_group

    assert parsed('{"sharedPVCImportFSGroup": 2000}') == 2000
    assert parsed('{"sharedPVCImportFSGroup": null}') is None
    assert parsed('{"fsGroup": 3000}') is None  # the global fsGroup is not used for imports
    with pytest.raises(config.ConfigError, match="sharedPVCImportFSGroup"):
        parsed('{"sharedPVCImportFSGroup": -1}')
    with pytest.raises(config.ConfigError, match="sharedPVCImportFSGroup"):
        parsed('{"sharedPVCImportFSGroup": "2000"}')


def test_parsed_config_is_immutable() -> None:
    parsed = config.parse_config({})
    with pytest.raises(ValueError, match="frozen"):
        parsed.local_model.enabled = True  # type: ignore[misc]


@pytest.mark.parametrize(
    ("section", "text", "key", "fragment"),
    [
        ("localModel", "{", "", "invalid JSON"),
        ("localModel", "", "", "invalid JSON"),
        ("localModel", "[1]", "", "expected a JSON object"),
        ("localModel", '{"enabled": "true"}', "enabled", "valid boolean"),
        ("localModel", '{"jobNamespace": "Not_A_Namespace"}', "jobNamespace", "pattern"),
        ("localModel", '{"jobNamespace": ""}', "jobNamespace", "pattern"),
        ("localModel", '{"fsGroup": "1000"}', "fsGroup", "valid integer"),
        ("localModel", '{"fsGroup": -1}', "fsGroup", "greater than or equal to 0"),
        ("localModel", '{"jobTTLSecondsAfterFinished": 1.5}', "jobTTLSecondsAfterFinished", ""),
        (
            "localModel",
            '{"jobTTLSecondsAfterFinished": 4294967296}',
            "jobTTLSecondsAfterFinished",
            "less than or equal",
        ),
        ("localModel", '{"reconcilationFrequencyInSecs": 0}', "reconcilationFrequencyInSecs", ""),
        (
            "localModel",
            '{"reconcilationFrequencyInSecs": 60.0}',
            "reconcilationFrequencyInSecs",
            "integer",
        ),
        ("localModel", '{"disableVolumeManagement": 1}', "disableVolumeManagement", "boolean"),
        ("localModel", '{"downloadRetryBackoffInSecs": 0}', "downloadRetryBackoffInSecs", ""),
        (
            "localModel",
            '{"downloadRetryBackoffInSecs": 100, "downloadRetryMaxBackoffInSecs": 10}',
            "downloadRetryMaxBackoffInSecs",
            "at least downloadRetryBackoffInSecs",
        ),
        ("localModel", '{"namespaceStorageSharePercent": 0}', "namespaceStorageSharePercent", ""),
        ("localModel", '{"namespaceStorageSharePercent": 101}', "namespaceStorageSharePercent", ""),
        ("storageInitializer", '{"image": ""}', "image", "at least 1"),
        ("storageInitializer", '{"image": 7}', "image", "valid string"),
        ("storageInitializer", '{"cpuRequest": "lots"}', "cpuRequest", "invalid quantity"),
        ("storageInitializer", '{"memoryLimit": ""}', "memoryLimit", "invalid quantity"),
        ("storageInitializer", '{"cpuRequest": "2"}', "cpuRequest", "exceeds the limit 1"),
        ("storageInitializer", '{"memoryRequest": "2Gi"}', "memoryRequest", "exceeds"),
        ("storageInitializer", '{"ociModelMode": "bogus"}', "ociModelMode", "'modelcar'"),
        ("storageInitializer", '{"uidModelcar": "1"}', "uidModelcar", "integer"),
        ("credentials", "null", "", "expected a JSON object"),
        ("credentials", '{"s3": []}', "s3", "dictionary"),
        ("credentials", '{"s3": {"s3UseHttps": true}}', "s3.s3UseHttps", "valid string"),
        ("credentials", '{"gcs": {"gcsCredentialFileName": 1}}', "gcs.gcsCredentialFileName", ""),
        ("credentials", '{"storageSpecSecretName": null}', "storageSpecSecretName", "string"),
    ],
)
def test_each_bad_value_names_its_section_and_key(
    section: str, text: str, key: str, fragment: str
) -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.parse_config({**SHIPPED, section: text})
    error = caught.value
    assert (error.section, error.key) == (section, key)
    message = str(error)
    assert message.startswith("inferenceservice-config: ")
    assert f"{section}.{key}:" in message if key else f"{section}:" in message
    assert fragment in message


def test_a_non_string_section_is_a_config_error() -> None:
    with pytest.raises(config.ConfigError, match="localModel: expected a string"):
        config.parse_config({"localModel": {"enabled": True}})  # type: ignore[dict-item]


def test_config_error_is_a_localcache_error() -> None:
    from localcache.runtime import errors

    assert issubclass(config.ConfigError, errors.LocalcacheError)


_json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
_keys = st.sampled_from(
    [
        "enabled",
        "jobNamespace",
        "fsGroup",
        "sharedPVCImportFSGroup",
        "jobTTLSecondsAfterFinished",
        "reconcilationFrequencyInSecs",
        "image",
        "cpuRequest",
        "memoryLimit",
        "ociModelMode",
        "s3",
        "gcs",
        "storageSpecSecretName",
    ]
)


@given(
    section=st.sampled_from(["localModel", "storageInitializer", "credentials"]),
    body=st.one_of(
        st.text(max_size=30),
        st.dictionaries(_keys, _json_values, max_size=4).map(json.dumps),
        _json_values.map(json.dumps),
    ),
)
def test_any_input_parses_or_raises_config_error(section: str, body: str) -> None:
    outcome: config.InferenceServiceConfig | config.ConfigError
    try:
        outcome = config.parse_config({section: body})
    except config.ConfigError as error:
        outcome = error
    if isinstance(outcome, config.ConfigError):
        assert outcome.section == section
        assert str(outcome).startswith(f"inferenceservice-config: {section}")
