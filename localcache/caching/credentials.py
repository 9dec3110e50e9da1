"""What credentials a download Job gets: pure rules over already-fetched objects, no I/O.

Reference §5 (KServe `pkg/credentials`) with spec §2's changes. The I/O side stays trivial:

    fetch = plan(request, settings)           # the ServiceAccount to get (None if absent)
    names = secret_names(fetch, sa)           # then these Secrets, all in fetch.namespace
    injection = resolve(request, settings, service_account=sa, secrets={name: dict | None})

Precedence (§5.1): neither `serviceAccountName` nor `storage` → nothing. `storage.key` → the
storage-config path (§5.3). Else the service-account path (§5.2, the named SA or `default`);
`storage.parameters` without `key` also give `STORAGE_OVERRIDE_CONFIG` over the optional
`default`/`default_<type>` storage-config entry (KServe ignored them).

Differences from KServe, on purpose:
- No secret value ever reaches the output: secret data is referenced (`secretKeyRef`) or
  mounted (secret volume). Values are only read to classify: an S3 endpoint's scheme (a
  referenced endpoint gets `AWS_ENDPOINT_URL` through `$(S3_ENDPOINT)` expansion), a
  storage-config entry's `type`/`bucket` (its `cabundle_configmap` is not copied out), and the
  `https-host`, which names the headers env var the storage initializer looks up.
- A missing named ServiceAccount, a missing Secret it lists, a missing storage-config Secret
  or key, or a malformed entry raise `CredentialError` naming object, key and namespace (KServe
  logged and went on without credentials). A missing unnamed `default` SA injects nothing.
- Absent secret keys are never referenced (KServe always referenced `AZURE_TENANT_ID`); each
  secret volume is mounted once.
- The pod runs as the named ServiceAccount; one annotated for Azure workload identity also gets
  the pod label that webhook needs. IRSA (`eks.amazonaws.com/role-arn`) adds the S3 option
  envs from the SA's annotations and `credentials.s3`, as in KServe.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from localcache.api import modelnode
from localcache.caching import config
from localcache.runtime import errors

STORAGE_CONFIG_SECRET = "storage-config"
GCS_CREDENTIAL_FILE = "gcloud-application-credentials.json"
SCHEME_PLACEHOLDER = "<scheme-placeholder>"
STORAGE_TYPES = ("s3", "hdfs", "webhdfs")
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"
AZURE_WI_ANNOTATION = "azure.workload.identity/client-id"
AZURE_WI_LABEL = "azure.workload.identity/use"
_S3_ANNOTATION = "serving.kserve.io/s3-"
_AZURE_KEYS = (
    "AZURE_SUBSCRIPTION_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET",
    "AZURE_STORAGE_ACCESS_KEY", "AZURE_ACCESS_TOKEN", "AZURE_ACCESS_EXPIRES_ON_SECONDS",
    "AZURE_ACCOUNT_NAME", "AZURE_SERVICE_URL",
)  # fmt: skip
_AZURE_LEGACY = {k: k.replace("AZURE_", "AZ_", 1) for k in _AZURE_KEYS[:4]}
# (env, annotation suffix, config attribute); the secret data key is the env's own name.
_S3_OPTIONS = (
    ("S3_VERIFY_SSL", "verifyssl", "s3_verify_ssl"),
    ("awsAnonymousCredential", "useanoncredential", "s3_use_anonymous_credential"),
    ("AWS_DEFAULT_REGION", "region", "s3_region"),
    ("S3_USER_VIRTUAL_BUCKET", "usevirtualbucket", "s3_use_virtual_bucket"),
    ("S3_USE_ACCELERATE", "useaccelerate", "s3_use_accelerate"),
    ("AWS_CA_BUNDLE", "cabundle", "s3_ca_bundle"),
    ("AWS_CA_BUNDLE_CONFIGMAP", "cabundle-configmap", "s3_ca_bundle_config_map"),
)


class CredentialError(errors.LocalcacheError):
    """Credentials were asked for but cannot be provided; the message says what is missing."""


@dataclass(frozen=True, slots=True)
class CredentialRequest:
    """What one entry asks for. `namespace` is where its ServiceAccount and Secrets are read:
    the entry's namespace for a namespace cache, `jobNamespace` for a cluster cache."""

    namespace: str
    uri: str
    service_account_name: str | None = None
    has_storage: bool = False
    storage_key: str | None = None
    parameters: Mapping[str, str] | None = None

    @property
    def wants_credentials(self) -> bool:
        return bool(self.service_account_name) or self.has_storage


def request_for(entry: modelnode.LocalModelInfo, *, job_namespace: str) -> CredentialRequest:
    """The request of a LocalModelNode entry; a cluster entry's objects live in jobNamespace."""
    storage = entry.storage
    return CredentialRequest(
        namespace=entry.namespace or job_namespace,
        uri=entry.source_model_uri,
        service_account_name=entry.service_account_name or None,
        has_storage=storage is not None,
        storage_key=(storage.key or None) if storage is not None else None,
        parameters=dict(storage.parameters or {}) if storage is not None else None,
    )


def credential_scope(request: CredentialRequest) -> Hashable | None:
    """Who proved access: None when no credentials are needed; else (namespace, service
    account, storage key, parameters). Downloads are shared only within one scope (spec §5)."""
    if not request.wants_credentials:
        return None
    return (
        request.namespace,
        request.service_account_name or "default",
        request.storage_key,
        tuple(sorted((request.parameters or {}).items())),
    )


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """Objects to read, all in `namespace`. A missing required object is a CredentialError."""

    namespace: str
    service_account: str | None = None
    service_account_required: bool = False
    storage_secret: str | None = None
    use_service_account_secrets: bool = False


@dataclass(frozen=True, slots=True)
class Injection:
    """What to add to the download pod, in Kubernetes JSON shape. `uri` is the URI to download
    (the placeholder rewrite applied); env/volumes/mounts are appended to the container's own."""

    uri: str
    env: tuple[dict[str, Any], ...] = ()
    volumes: tuple[dict[str, Any], ...] = ()
    volume_mounts: tuple[dict[str, Any], ...] = ()
    service_account_name: str | None = None
    pod_labels: Mapping[str, str] = field(default_factory=dict)


def plan(request: CredentialRequest, settings: config.CredentialsConfig) -> FetchPlan:
    """Which ServiceAccount and storage-config Secret to read for `request`."""
    if not request.wants_credentials:
        return FetchPlan(namespace=request.namespace)
    named = request.service_account_name
    keyed = request.storage_key is not None
    overrides = not keyed and bool(request.parameters)
    secret_name = settings.storage_spec_secret_name or STORAGE_CONFIG_SECRET
    return FetchPlan(
        namespace=request.namespace,
        service_account=named or (None if keyed else "default"),
        service_account_required=bool(named),
        storage_secret=secret_name if keyed or overrides else None,
        use_service_account_secrets=not keyed,
    )


def secret_names(fetch: FetchPlan, service_account: Mapping[str, Any] | None) -> list[str]:
    """The Secrets to read once the ServiceAccount is known: the storage-config Secret, then
    (service-account path) every Secret the SA lists, in order, without repeats."""
    names = [fetch.storage_secret] if fetch.storage_secret else []
    if fetch.use_service_account_secrets and service_account is not None:
        for ref in service_account.get("secrets") or []:
            name = ref.get("name")
            if name and name not in names:
                names.append(name)
    return names


def resolve(
    request: CredentialRequest,
    settings: config.CredentialsConfig,
    *,
    service_account: Mapping[str, Any] | None,
    secrets: Mapping[str, Mapping[str, Any] | None],
) -> Injection:
    """Turn fetched objects into the Injection; raises CredentialError (see module doc)."""
    fetch = plan(request, settings)
    ns = request.namespace
    if not request.wants_credentials:
        return Injection(uri=request.uri)
    if fetch.service_account_required and service_account is None:
        raise CredentialError(
            f"ServiceAccount {ns}/{fetch.service_account} not found in namespace {ns}"
        )
    out = _Builder()
    if fetch.use_service_account_secrets and service_account is not None:
        _service_account_path(out, settings, service_account, secrets, ns)
    uri = request.uri
    if fetch.storage_secret is not None:
        uri = _storage_config_path(out, request, fetch.storage_secret, secrets, ns)
    sa_annotations = (service_account or {}).get("metadata", {}).get("annotations") or {}
    azure_wi = request.service_account_name and sa_annotations.get(AZURE_WI_ANNOTATION)
    return Injection(
        uri=uri,
        env=tuple(out.env),
        volumes=tuple(out.volumes),
        volume_mounts=tuple(out.mounts),
        service_account_name=request.service_account_name,
        pod_labels={AZURE_WI_LABEL: "true"} if azure_wi else {},
    )


# ---- helpers ------------------------------------------------------------------------------
class _Builder:
    def __init__(self) -> None:
        self.env: list[dict[str, Any]] = []
        self.volumes: list[dict[str, Any]] = []
        self.mounts: list[dict[str, Any]] = []

    def add_env(self, envs: Sequence[dict[str, Any]], *, override: bool = False) -> None:
        """Append; with `override`, an env of the same name is replaced in place (MergeEnvs)."""
        for env in envs:
            at = next((i for i, e in enumerate(self.env) if e["name"] == env["name"]), None)
            if override and at is not None:
                self.env[at] = env
            else:
                self.env.append(env)

    def add_secret_volume(self, name: str, secret: str, mount_path: str) -> None:
        if all(v["name"] != name for v in self.volumes):
            self.volumes.append({"name": name, "secret": {"secretName": secret}})
        if all(m["name"] != name for m in self.mounts):
            self.mounts.append({"name": name, "mountPath": mount_path, "readOnly": True})


def _ref(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _plain(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _data(secret: Mapping[str, Any] | None) -> Mapping[str, str]:
    return (secret or {}).get("data") or {}


def _decode(secret: Mapping[str, Any], key: str) -> str:
    """A secret value, for classification only: never returned into an Injection."""
    raw = _data(secret).get(key, "")
    try:
        return base64.b64decode(raw, validate=True).decode("utf-8").strip()
    except (binascii.Error, UnicodeDecodeError):
        return ""


def _s3_envs(
    annotations: Mapping[str, str], secret: Mapping[str, Any] | None, s3: config.S3Config
) -> list[dict[str, Any]]:
    """BuildS3EnvVars: annotation > secret data key named like the env > `credentials.s3`."""
    data = _data(secret)
    name = ((secret or {}).get("metadata") or {}).get("name", "")

    def pick(env: str, suffix: str, config: str) -> dict[str, Any] | None:
        if value := (annotations.get(_S3_ANNOTATION + suffix) or "").strip():
            return _plain(env, value)
        if env in data and secret is not None:
            return _ref(env, name, env)
        return _plain(env, config) if config else None

    def scheme(flag: dict[str, Any] | None) -> str:
        value = flag.get("value") if flag else None
        if flag is not None and value is None:
            value = _decode(secret or {}, "S3_USE_HTTPS")
        return "http://" if value == "0" else "https://"

    envs: list[dict[str, Any]] = []
    https = pick("S3_USE_HTTPS", "usehttps", s3.s3_use_https)
    endpoint = pick("S3_ENDPOINT", "endpoint", s3.s3_endpoint)
    if endpoint is not None:
        referenced = "value" not in endpoint
        raw = _decode(secret or {}, "S3_ENDPOINT") if referenced else endpoint["value"]
        given, sep, rest = raw.partition("://")
        if sep and given in ("http", "https"):
            https = _plain("S3_USE_HTTPS", "1" if given == "https" else "0")
            url = "$(S3_ENDPOINT)" if referenced else raw
            endpoint = endpoint if referenced else _plain("S3_ENDPOINT", rest)
        else:
            url = scheme(https) + ("$(S3_ENDPOINT)" if referenced else raw)
        envs += [e for e in (https, endpoint, _plain("AWS_ENDPOINT_URL", url)) if e is not None]
    elif https is not None:
        envs.append(https)
    for env, suffix, attr in _S3_OPTIONS:
        if (picked := pick(env, suffix, getattr(s3, attr))) is not None:
            envs.append(picked)
    return envs


def _service_account_path(
    out: _Builder,
    settings: config.CredentialsConfig,
    service_account: Mapping[str, Any],
    secrets: Mapping[str, Mapping[str, Any] | None],
    ns: str,
) -> None:
    meta = service_account.get("metadata") or {}
    sa_name = meta.get("name", "")
    annotations = meta.get("annotations") or {}
    if IRSA_ANNOTATION in annotations:
        out.add_env(_s3_envs(annotations, None, settings.s3))
    for ref in service_account.get("secrets") or []:
        name = ref.get("name")
        if not name:
            continue
        secret = secrets.get(name)
        if secret is None:
            by = f"listed by ServiceAccount {ns}/{sa_name}"
            raise CredentialError(f"Secret {ns}/{name} ({by}) not found in namespace {ns}")
        _classify(out, settings, name, secret)


def _classify(
    out: _Builder, settings: config.CredentialsConfig, name: str, secret: Mapping[str, Any]
) -> None:
    """Reference §5.2: the first matching data key decides the secret's kind."""
    data = _data(secret)
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    s3 = settings.s3
    gcs_file = settings.gcs.gcs_credential_file_name or GCS_CREDENTIAL_FILE
    secret_key_name = s3.s3_secret_access_key_name or "awsSecretAccessKey"  # KServe's fallbacks
    if secret_key_name in data:
        pairs = (("AWS_ACCESS_KEY_ID", s3.s3_access_key_id_name or "awsAccessKeyID"),
                 ("AWS_SECRET_ACCESS_KEY", secret_key_name))  # fmt: skip
        keys = [_ref(env, name, key) for env, key in pairs if key in data]
        out.add_env([*keys, *_s3_envs(annotations, secret, s3)], override=True)
    elif gcs_file in data:
        out.add_secret_volume("user-gcp-sa", name, "/var/secrets/")
        out.add_env([_plain("GOOGLE_APPLICATION_CREDENTIALS", f"/var/secrets/{gcs_file}")])
    elif any(k in data for k in ("AZ_CLIENT_ID", "AZURE_CLIENT_ID", "AZURE_ACCESS_TOKEN")):
        legacy = {env: _AZURE_LEGACY.get(env, env) for env in _AZURE_KEYS}  # legacy key wins
        azure = {env: key if key in data else env for env, key in legacy.items()}
        out.add_env([_ref(env, name, key) for env, key in azure.items() if key in data])
    elif "AZURE_STORAGE_ACCESS_KEY" in data:
        out.add_env([_ref("AZURE_STORAGE_ACCESS_KEY", name, "AZURE_STORAGE_ACCESS_KEY")])
    elif "https-host" in data:
        host = _decode(secret, "https-host")
        if host and "headers" in data:
            out.add_env([_ref(f"{host}-headers", name, "headers")])
    elif "HDFS_NAMENODE" in data:
        out.add_secret_volume("hdfs-secrets", name, "/var/secrets/kserve-hdfscreds")
    elif "HF_TOKEN" in data:
        out.add_env([_ref("HF_TOKEN", name, "HF_TOKEN")])
    elif "MODELSCOPE_API_TOKEN" in data:
        out.add_env([_ref("MODELSCOPE_API_TOKEN", name, "MODELSCOPE_API_TOKEN")])


def _storage_config_path(
    out: _Builder,
    request: CredentialRequest,
    secret_name: str,
    secrets: Mapping[str, Mapping[str, Any] | None],
    ns: str,
) -> str:
    """Reference §5.3; returns the URI with `<scheme-placeholder>://` rewritten."""
    params = dict(request.parameters or {})
    stype, bucket = params.get("type", ""), params.get("bucket", "")
    key = request.storage_key
    secret = secrets.get(secret_name)
    where = f"Secret {ns}/{secret_name}"
    if key is not None:
        if secret is None:
            what = f"storage-config for storage key {key}"
            raise CredentialError(f"{where} ({what}) not found in namespace {ns}")
        if key not in _data(secret):
            raise CredentialError(f"storage key {key} not found in {where}")
    else:
        key = f"default_{stype}" if stype else "default"
    if secret is not None and key in _data(secret):
        if not stype:
            try:
                entry = json.loads(base64.b64decode(_data(secret)[key]))
            except (ValueError, binascii.Error):
                entry = None
            if not isinstance(entry, dict):
                raise CredentialError(f"storage key {key} in {where} is not a JSON object")
            stype = str(entry.get("type") or "")
            if stype and stype not in STORAGE_TYPES:
                raise CredentialError(
                    f"storage key {key} in {where}: storage type must be one of "
                    f"[{', '.join(STORAGE_TYPES)}]. storage type [{stype}] is not supported"
                )
            bucket = bucket or str(entry.get("bucket") or "")
        out.add_env([_ref("STORAGE_CONFIG", secret_name, key)])
    if request.storage_key is not None and not stype:
        raise CredentialError(
            f"unable to determine storage type for storage key {key} in {where}: "
            "set `type` in the entry or in storage.parameters"
        )
    uri = request.uri
    prefix = f"{SCHEME_PLACEHOLDER}://"
    if uri.startswith(prefix):
        path = uri[len(prefix) :]
        if not stype:
            raise CredentialError(f"cannot rewrite {uri}: storage type unknown")
        if stype == "s3":
            if not bucket:
                raise CredentialError(
                    "format [s3] requires a bucket but one wasn't found in storage data "
                    f"or parameters ({where}, key {key})"
                )
            uri = f"s3://{bucket}/{path}"
        else:
            uri = f"{stype}://{path}"
    if params:
        out.add_env([_plain("STORAGE_OVERRIDE_CONFIG", json.dumps(params, sort_keys=True))])
    return uri
