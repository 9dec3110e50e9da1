"""How one Secret becomes env vars and volumes of a download Job: KServe's classification
(reference §5.2, `pkg/credentials`), pure, no I/O.

- `classify()`: the first matching data key decides a Secret's kind (S3 keys, a GCS key file,
  Azure, an `https-host` with headers, HDFS, Hugging Face, ModelScope) and adds its env vars
  (as `secretKeyRef`s) or its secret volume to a `Builder`;
- `s3_envs()`: KServe's BuildS3EnvVars (annotation > secret data key named like the env >
  `credentials.s3`), shared by the S3 secret and IRSA service-account paths;
- `Builder` collects env (with MergeEnvs' override), volumes and mounts, each volume once.

No secret value ever reaches the output: `decode_value()` reads a value only to classify it
(an S3 endpoint's scheme, the `https-host`). Which Secrets are read, and in what order, is
`credentials`'.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from localcache.caching import config

GCS_CREDENTIAL_FILE = "gcloud-application-credentials.json"
S3_ANNOTATION = "serving.kserve.io/s3-"
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


class Builder:
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


def secret_ref(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def plain_env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def secret_data(secret: Mapping[str, Any] | None) -> Mapping[str, str]:
    return (secret or {}).get("data") or {}


def decode_value(secret: Mapping[str, Any], key: str) -> str:
    """A secret value, for classification only: never returned into an Injection."""
    raw = secret_data(secret).get(key, "")
    try:
        return base64.b64decode(raw, validate=True).decode("utf-8").strip()
    except (binascii.Error, UnicodeDecodeError):
        return ""


def s3_envs(
    annotations: Mapping[str, str], secret: Mapping[str, Any] | None, s3: config.S3Config
) -> list[dict[str, Any]]:
    """BuildS3EnvVars: annotation > secret data key named like the env > `credentials.s3`."""
    data = secret_data(secret)
    name = ((secret or {}).get("metadata") or {}).get("name", "")

    def pick(env: str, suffix: str, config: str) -> dict[str, Any] | None:
        if value := (annotations.get(S3_ANNOTATION + suffix) or "").strip():
            return plain_env(env, value)
        if env in data and secret is not None:
            return secret_ref(env, name, env)
        return plain_env(env, config) if config else None

    def scheme(flag: dict[str, Any] | None) -> str:
        value = flag.get("value") if flag else None
        if flag is not None and value is None:
            value = decode_value(secret or {}, "S3_USE_HTTPS")
        return "http://" if value == "0" else "https://"

    envs: list[dict[str, Any]] = []
    https = pick("S3_USE_HTTPS", "usehttps", s3.s3_use_https)
    endpoint = pick("S3_ENDPOINT", "endpoint", s3.s3_endpoint)
    if endpoint is not None:
        referenced = "value" not in endpoint
        raw = decode_value(secret or {}, "S3_ENDPOINT") if referenced else endpoint["value"]
        given, sep, rest = raw.partition("://")
        if sep and given in ("http", "https"):
            https = plain_env("S3_USE_HTTPS", "1" if given == "https" else "0")
            url = "$(S3_ENDPOINT)" if referenced else raw
            endpoint = endpoint if referenced else plain_env("S3_ENDPOINT", rest)
        else:
            url = scheme(https) + ("$(S3_ENDPOINT)" if referenced else raw)
        envs += [e for e in (https, endpoint, plain_env("AWS_ENDPOINT_URL", url)) if e is not None]
    elif https is not None:
        envs.append(https)
    for env, suffix, attr in _S3_OPTIONS:
        if (picked := pick(env, suffix, getattr(s3, attr))) is not None:
            envs.append(picked)
    return envs


def classify(
    out: Builder, settings: config.CredentialsConfig, name: str, secret: Mapping[str, Any]
) -> None:
    """Reference §5.2: the first matching data key decides the secret's kind."""
    data = secret_data(secret)
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    s3 = settings.s3
    gcs_file = settings.gcs.gcs_credential_file_name or GCS_CREDENTIAL_FILE
    secret_key_name = s3.s3_secret_access_key_name or "awsSecretAccessKey"  # KServe's fallbacks
    if secret_key_name in data:
        pairs = (("AWS_ACCESS_KEY_ID", s3.s3_access_key_id_name or "awsAccessKeyID"),
                 ("AWS_SECRET_ACCESS_KEY", secret_key_name))  # fmt: skip
        keys = [secret_ref(env, name, key) for env, key in pairs if key in data]
        out.add_env([*keys, *s3_envs(annotations, secret, s3)], override=True)
    elif gcs_file in data:
        out.add_secret_volume("user-gcp-sa", name, "/var/secrets/")
        out.add_env([plain_env("GOOGLE_APPLICATION_CREDENTIALS", f"/var/secrets/{gcs_file}")])
    elif any(k in data for k in ("AZ_CLIENT_ID", "AZURE_CLIENT_ID", "AZURE_ACCESS_TOKEN")):
        legacy = {env: _AZURE_LEGACY.get(env, env) for env in _AZURE_KEYS}  # legacy key wins
        azure = {env: key if key in data else env for env, key in legacy.items()}
        out.add_env([secret_ref(env, name, key) for env, key in azure.items() if key in data])
    elif "AZURE_STORAGE_ACCESS_KEY" in data:
        out.add_env([secret_ref("AZURE_STORAGE_ACCESS_KEY", name, "AZURE_STORAGE_ACCESS_KEY")])
    elif "https-host" in data:
        host = decode_value(secret, "https-host")
        if host and "headers" in data:
            out.add_env([secret_ref(f"{host}-headers", name, "headers")])
    elif "HDFS_NAMENODE" in data:
        out.add_secret_volume("hdfs-secrets", name, "/var/secrets/kserve-hdfscreds")
    elif "HF_TOKEN" in data:
        out.add_env([secret_ref("HF_TOKEN", name, "HF_TOKEN")])
    elif "MODELSCOPE_API_TOKEN" in data:
        out.add_env([secret_ref("MODELSCOPE_API_TOKEN", name, "MODELSCOPE_API_TOKEN")])
