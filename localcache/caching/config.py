"""Parse the `inferenceservice-config` ConfigMap: the `localModel`, `storageInitializer` and
`credentials` JSON sections, with KServe's key names and the values KServe ships as defaults.

Contract:
- `parse_config(configmap.data)` returns a frozen `InferenceServiceConfig`, or raises
  `ConfigError` whose message names the section and key (`localModel.fsGroup: ...`). It never
  raises anything else, whatever the input: callers keep their last good configuration and
  surface the error (KServe panics on bad JSON here; we do not).
- A missing section, or a key missing from a section, takes the default KServe ships in its
  ConfigMap (e.g. `jobNamespace` = `kserve-localmodel-jobs`, `fsGroup` = 1000). An explicit
  JSON `null` for `fsGroup` means "no fsGroup"; for the other optional numbers it means the
  default, as it does in KServe. `sharedPVCImportFSGroup` (KServe's, the import Jobs of
  shared-volume caches) has no default: absent or `null` means no fsGroup.
- Values are type-checked strictly, like Go's `json.Unmarshal` (`"60"` is not a number, `60.0`
  is not an integer) and range-checked; unknown keys are ignored.
- localcache's own keys live in `localModel`: `downloadRetryBackoffInSecs` (first retry of a
  failed download, default 60), `downloadRetryMaxBackoffInSecs` (cap of the doubling,
  default 3600), `downloadStallTimeoutInSecs` (default 600, 0: off), `namespaceStorageSharePercent`
  (default 50) and `volumeSource`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from localcache.api import quantity
from localcache.runtime import errors

CONFIGMAP_NAME: Final = "inferenceservice-config"
DEFAULT_NAMESPACE: Final = "kserve"
LOCAL_MODEL: Final = "localModel"
STORAGE_INITIALIZER: Final = "storageInitializer"
CREDENTIALS: Final = "credentials"

DEFAULT_NAMESPACE_SHARE_PERCENT: Final = 50
"""Of a node group's storageLimit, what one namespace's caches may declare (finding 9)."""
DNS1123_LABEL: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
INT32_MAX: Final = 2**31 - 1


class ConfigError(errors.LocalcacheError):
    """The ConfigMap has bad JSON or a bad value. `section` and `key` (a dotted path inside the
    section, "" for the section as a whole) name the first problem."""

    def __init__(self, message: str, *, section: str, key: str = "") -> None:
        super().__init__(message)
        self.section = section
        self.key = key


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="ignore", strict=True, frozen=True, validate_by_name=True, validate_by_alias=True
    )


class LocalModelConfig(_Section):
    """The `localModel` section (KServe's `LocalModelConfig`) plus localcache's retry keys."""

    enabled: bool = False
    job_namespace: str = Field(
        "kserve-localmodel-jobs", alias="jobNamespace", max_length=63, pattern=DNS1123_LABEL
    )
    default_job_image: str = Field("kserve/storage-initializer:latest", alias="defaultJobImage")
    fs_group: int | None = Field(1000, alias="fsGroup", ge=0)
    shared_pvc_import_fs_group: int | None = Field(None, alias="sharedPVCImportFSGroup", ge=0)
    """KServe's: the fsGroup of a shared-volume cache's import Job (in the tenant's namespace,
    where `fsGroup`, sized for jobNamespace, may be refused); none when absent or null."""
    job_ttl_seconds_after_finished: int = Field(
        3600, alias="jobTTLSecondsAfterFinished", ge=0, le=INT32_MAX
    )
    reconcilation_frequency_in_secs: int = Field(60, alias="reconcilationFrequencyInSecs", ge=1)
    disable_volume_management: bool = Field(False, alias="disableVolumeManagement")
    download_retry_backoff_in_secs: int = Field(60, alias="downloadRetryBackoffInSecs", ge=1)
    download_retry_max_backoff_in_secs: int = Field(
        3600, alias="downloadRetryMaxBackoffInSecs", ge=1
    )
    download_stall_timeout_in_secs: int = Field(600, alias="downloadStallTimeoutInSecs", ge=0)
    """localcache's: a running download whose staging folder has not grown for this long is
    stopped (`DownloadStalled`) and retried with the backoff; 0 never stops one."""
    namespace_storage_share_percent: int = Field(
        DEFAULT_NAMESPACE_SHARE_PERCENT, alias="namespaceStorageSharePercent", ge=1, le=100
    )
    """localcache's: what the namespace caches of one namespace may declare on a node group,
    in percent of its storageLimit (100: no share of its own, only the group's limit)."""
    volume_source: Literal["csi", "hostPath"] = Field("csi", alias="volumeSource")
    """localcache's: `csi` PVs are served by localcache's CSI node plugin, which shows a pod
    only its cache's folder (README "Security model"); `hostPath` keeps the node group's own
    PV source, KServe's choice, which shows every pod the whole models root."""
    serving_pods_wait_for_copy: bool = Field(True, alias="servingPodsWaitForCopy")
    """localcache's: serving pods get a required node affinity on the per-node readiness
    label of their cache, so they start only where the copy is complete (README "Serving
    pods wait for their copy"); false keeps KServe's behaviour and removes the labels."""

    @pydantic.field_validator(
        "job_ttl_seconds_after_finished",
        "reconcilation_frequency_in_secs",
        "download_retry_backoff_in_secs",
        "download_retry_max_backoff_in_secs",
        "download_stall_timeout_in_secs",
        mode="before",
    )
    @classmethod
    def _none_means_default(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        # A JSON null for a Go pointer field leaves the default in place.
        if value is None and info.field_name is not None:
            return cls.model_fields[info.field_name].default
        return value

    @pydantic.model_validator(mode="after")
    def _backoff_order(self) -> LocalModelConfig:
        if self.download_retry_max_backoff_in_secs < self.download_retry_backoff_in_secs:
            raise _KeyedError(
                "downloadRetryMaxBackoffInSecs",
                f"must be at least downloadRetryBackoffInSecs "
                f"({self.download_retry_backoff_in_secs})",
            )
        return self


class StorageInitializerConfig(_Section):
    """The `storageInitializer` section (KServe's `StorageInitializerConfig`)."""

    image: str = Field("kserve/storage-initializer:latest", min_length=1)
    cpu_request: str = Field("100m", alias="cpuRequest")
    cpu_limit: str = Field("1", alias="cpuLimit")
    memory_request: str = Field("100Mi", alias="memoryRequest")
    memory_limit: str = Field("1Gi", alias="memoryLimit")
    cpu_modelcar: str = Field("10m", alias="cpuModelcar")
    memory_modelcar: str = Field("15Mi", alias="memoryModelcar")
    ca_bundle_config_map_name: str = Field("", alias="caBundleConfigMapName")
    ca_bundle_volume_mount_path: str = Field(
        "/etc/ssl/custom-certs", alias="caBundleVolumeMountPath"
    )
    enable_direct_pvc_volume_mount: bool = Field(False, alias="enableDirectPvcVolumeMount")
    enable_modelcar: bool = Field(False, alias="enableModelcar")
    uid_modelcar: int | None = Field(None, alias="uidModelcar")
    enable_oci_model_support: bool = Field(False, alias="enableOciModelSupport")
    oci_model_mode: Literal["", "modelcar", "native", "fetch"] = Field("", alias="ociModelMode")
    oci_insecure_registry: bool = Field(False, alias="ociInsecureRegistry")

    @pydantic.field_validator(
        "cpu_request",
        "cpu_limit",
        "memory_request",
        "memory_limit",
        "cpu_modelcar",
        "memory_modelcar",
    )
    @classmethod
    def _quantity(cls, value: str) -> str:
        quantity.Quantity(value)
        return value

    @pydantic.model_validator(mode="after")
    def _requests_within_limits(self) -> StorageInitializerConfig:
        for request, limit, key in (
            (self.cpu_request, self.cpu_limit, "cpuRequest"),
            (self.memory_request, self.memory_limit, "memoryRequest"),
        ):
            if quantity.Quantity(request) > quantity.Quantity(limit):
                raise _KeyedError(key, f"{request} exceeds the limit {limit}")
        return self

    def resources(self) -> dict[str, dict[str, str]]:
        """Container `resources` for a download Job."""
        return {
            "requests": {"cpu": self.cpu_request, "memory": self.memory_request},
            "limits": {"cpu": self.cpu_limit, "memory": self.memory_limit},
        }


class S3Config(_Section):
    """`credentials.s3`: secret key names and S3 options (KServe's `S3Config`)."""

    s3_access_key_id_name: str = Field("AWS_ACCESS_KEY_ID", alias="s3AccessKeyIDName")
    s3_secret_access_key_name: str = Field("AWS_SECRET_ACCESS_KEY", alias="s3SecretAccessKeyName")
    s3_endpoint: str = Field("", alias="s3Endpoint")
    s3_use_https: str = Field("", alias="s3UseHttps")
    s3_region: str = Field("", alias="s3Region")
    s3_verify_ssl: str = Field("", alias="s3VerifySSL")
    s3_use_virtual_bucket: str = Field("", alias="s3UseVirtualBucket")
    s3_use_accelerate: str = Field("", alias="s3UseAccelerate")
    s3_use_anonymous_credential: str = Field("", alias="s3UseAnonymousCredential")
    s3_ca_bundle_config_map: str = Field("", alias="s3CABundleConfigMap")
    s3_ca_bundle: str = Field("", alias="s3CABundle")


class GCSConfig(_Section):
    gcs_credential_file_name: str = Field(
        "gcloud-application-credentials.json", alias="gcsCredentialFileName"
    )


class CredentialsConfig(_Section):
    """The `credentials` section (KServe's `CredentialConfig`)."""

    storage_spec_secret_name: str = Field("storage-config", alias="storageSpecSecretName")
    storage_secret_name_annotation: str = Field(
        "serving.kserve.io/storageSecretName", alias="storageSecretNameAnnotation"
    )
    s3: S3Config = Field(default_factory=S3Config)
    gcs: GCSConfig = Field(default_factory=GCSConfig)


class InferenceServiceConfig(_Section):
    """The three sections localcache reads."""

    local_model: LocalModelConfig = Field(default_factory=LocalModelConfig, alias=LOCAL_MODEL)
    storage_initializer: StorageInitializerConfig = Field(
        default_factory=StorageInitializerConfig, alias=STORAGE_INITIALIZER
    )
    credentials: CredentialsConfig = Field(default_factory=CredentialsConfig, alias=CREDENTIALS)


class _KeyedError(ValueError):
    """Raised inside validators to name the offending key (pydantic reports the model)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


_SECTIONS: Final[tuple[tuple[str, type[_Section]], ...]] = (
    (LOCAL_MODEL, LocalModelConfig),
    (STORAGE_INITIALIZER, StorageInitializerConfig),
    (CREDENTIALS, CredentialsConfig),
)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _error_from_validation(section: str, exc: pydantic.ValidationError) -> ConfigError:
    problems = []
    first_key = ""
    for error in exc.errors(include_url=False):
        key = ".".join(str(part) for part in error["loc"])
        message = error["msg"]
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, _KeyedError):
            key = ".".join(part for part in (key, cause.key) if part)
            message = str(cause)
        elif isinstance(cause, Exception):
            message = str(cause)
        elif error["type"] != "missing":
            message += f" (got {_short(error.get('input'))})"
        first_key = first_key or key
        problems.append(f"{section}.{key}: {message}" if key else f"{section}: {message}")
    return ConfigError(f"{CONFIGMAP_NAME}: " + "; ".join(problems), section=section, key=first_key)


def parse_section(section: str, text: str) -> _Section:
    """Parse one section's JSON text; `ConfigError` naming the section and key."""
    model = dict(_SECTIONS)[section]
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(
            f"{CONFIGMAP_NAME}: {section}: invalid JSON: {exc}", section=section
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{CONFIGMAP_NAME}: {section}: expected a JSON object, got {type(data).__name__}",
            section=section,
        )
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise _error_from_validation(section, exc) from None


def parse_config(data: Mapping[str, str]) -> InferenceServiceConfig:
    """The configuration in a ConfigMap's `data`; defaults for missing sections and keys."""
    parsed: dict[str, _Section] = {}
    for section, _model in _SECTIONS:
        text = data.get(section)
        if text is None:
            continue
        if not isinstance(text, str):
            raise ConfigError(
                f"{CONFIGMAP_NAME}: {section}: expected a string of JSON", section=section
            )
        parsed[section] = parse_section(section, text)
    return InferenceServiceConfig.model_validate(parsed)


def _deep_merge(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(under)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(value, dict) and isinstance(below, dict):
            merged[key] = _deep_merge(below, value)
        else:
            merged[key] = value
    return merged


def layer_data(
    under: Mapping[str, Any], over: Mapping[str, Any], *, names: tuple[str, str]
) -> dict[str, Any]:
    """ConfigMap data `over` (localcache's own) laid over `under` (KServe's), `names` being
    theirs for error messages: per section, JSON objects are merged key by key (nested
    objects too) and `over`'s keys win; a section only one side has is taken as it is.
    Invalid JSON on either side of a merged section is a `ConfigError` naming the ConfigMap
    and the section."""
    layered = dict(under)
    for section, _model in _SECTIONS:
        if section not in over:
            continue
        if section not in under:
            layered[section] = over[section]
            continue
        halves = []
        for name, data in zip(names, (under, over), strict=True):
            try:
                half = json.loads(data[section]) if isinstance(data[section], str) else None
            except (ValueError, RecursionError) as exc:
                raise ConfigError(
                    f"{name}: {section}: invalid JSON: {exc}", section=section
                ) from None
            if not isinstance(half, dict):
                raise ConfigError(f"{name}: {section}: expected a JSON object", section=section)
            halves.append(half)
        layered[section] = json.dumps(_deep_merge(halves[0], halves[1]))
    return layered
