"""What credentials a download Job gets: pure rules over already-fetched objects, no I/O.

Reference §5 (KServe `pkg/credentials`) with spec §2's changes. The I/O side stays trivial:

    fetch = plan(request, settings)           # the ServiceAccount to get (None if absent)
    names = secret_names(fetch, sa)           # then these Secrets, all in fetch.namespace
    injection = resolve(request, settings, service_account=sa, secrets={name: dict | None})

Precedence (§5.1): neither `serviceAccountName` nor `storage` → nothing. `storage.key` → the
storage-config path (§5.3). Else the service-account path (§5.2, the named SA or `default`);
`storage.parameters` without `key` also give `STORAGE_OVERRIDE_CONFIG` over the optional
`default`/`default_<type>` storage-config entry (KServe ignored them). How each Secret a
service account lists becomes env vars or volumes is `secretenv.classify()`.

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
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from localcache.api import modelnode
from localcache.caching import config, secretenv
from localcache.runtime import errors

STORAGE_CONFIG_SECRET = "storage-config"
SCHEME_PLACEHOLDER = "<scheme-placeholder>"
STORAGE_TYPES = ("s3", "hdfs", "webhdfs")
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"
AZURE_WI_ANNOTATION = "azure.workload.identity/client-id"
AZURE_WI_LABEL = "azure.workload.identity/use"


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
    tenant: bool = False
    """A namespace cache's entry: its download runs in the tenant's namespace."""

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
        tenant=bool(entry.namespace),
    )


def credential_scope(request: CredentialRequest) -> Hashable | None:
    """Who proved access: None when no credentials are needed and the download runs in the
    job namespace (tenants cannot reach its pods); `(namespace,)` for a namespace cache's
    download without credentials (its pods run where the tenant may exec into them and write
    their bytes: never the open copy for anyone else, security review finding 3); else
    (namespace, service account, storage key, parameters). Downloads are shared only within
    one scope, or when their content is the same (`agent.disk.digest`)."""
    if not request.wants_credentials:
        return (request.namespace,) if request.tenant else None
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
    out = secretenv.Builder()
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


def _service_account_path(
    out: secretenv.Builder,
    settings: config.CredentialsConfig,
    service_account: Mapping[str, Any],
    secrets: Mapping[str, Mapping[str, Any] | None],
    ns: str,
) -> None:
    meta = service_account.get("metadata") or {}
    sa_name = meta.get("name", "")
    annotations = meta.get("annotations") or {}
    if IRSA_ANNOTATION in annotations:
        out.add_env(secretenv.s3_envs(annotations, None, settings.s3))
    for ref in service_account.get("secrets") or []:
        name = ref.get("name")
        if not name:
            continue
        secret = secrets.get(name)
        if secret is None:
            by = f"listed by ServiceAccount {ns}/{sa_name}"
            raise CredentialError(f"Secret {ns}/{name} ({by}) not found in namespace {ns}")
        secretenv.classify(out, settings, name, secret)


def _storage_config_path(
    out: secretenv.Builder,
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
        if key not in secretenv.secret_data(secret):
            raise CredentialError(f"storage key {key} not found in {where}")
    else:
        key = f"default_{stype}" if stype else "default"
    if secret is not None and key in secretenv.secret_data(secret):
        if not stype:
            try:
                entry = json.loads(base64.b64decode(secretenv.secret_data(secret)[key]))
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
        out.add_env([secretenv.secret_ref("STORAGE_CONFIG", secret_name, key)])
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
        out.add_env(
            [secretenv.plain_env("STORAGE_OVERRIDE_CONFIG", json.dumps(params, sort_keys=True))]
        )
    return uri
