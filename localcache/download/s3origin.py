"""The S3 origin as a download pod proving access sees it (`download.peerproof`): its
settings, the model's objects, and presigned HEADs of them. botocore; blocking calls.

Contract:
- `S3Settings.from_env(env)` reads the origin as KServe's storage initializer does: the
  `STORAGE_CONFIG` entry (JSON, `type: s3`; `STORAGE_OVERRIDE_CONFIG` merged over it) supplies
  `access_key_id`, `secret_access_key`, `endpoint_url`, `region`, `anonymous`, `verify_ssl`
  over the env `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`),
  `AWS_ENDPOINT_URL` (else `S3_ENDPOINT`, http when `S3_USE_HTTPS` is "0"), region
  `AWS_DEFAULT_REGION`/`AWS_REGION` (default us-east-1), `S3_USER_VIRTUAL_BUCKET` ("true"/"1":
  virtual-hosted addressing, else path style), `S3_VERIFY_SSL` ("0"/"false": no verification;
  else `AWS_CA_BUNDLE` or the system's CAs). Without keys, botocore's default chain answers
  (IRSA web identity, profiles, instance roles). Anonymous access (`awsAnonymousCredential`)
  proves nothing: "use origin", unless `anonymous_ok` (reading what the origin publishes to
  anyone, `download.seedsums`): then every request goes unsigned.
- `S3Origin(settings)`: a botocore client (SigV4, connect `CONNECT_TIMEOUT_S`, read
  `READ_TIMEOUT_S`, standard retries). `objects(uri)` lists `s3://bucket/prefix`
  (ListObjectsV2, paginated, keys ending in "/" skipped, at most `peer.MAX_FILES`) and maps
  each key to its folder path as the storage initializer does (`originpaths.s3_folder_path`);
  `proof(uri, objects, nonce)` presigns a HEAD of each (`peer.PROOF_EXPIRES_S`), signing the
  serving node's nonce as `If-None-Match` (`peer.nonce_header`) and the checksum mode;
  `checksums(uri, objects)` HEADs each in checksum mode for the SHA-256 the origin stores
  (`download.seedsums`). They block: run them in a thread.
- Errors: `peersources.FetchError` "use origin" when the origin refuses or cannot serve the
  listing or presign (no credentials, AccessDenied, no such bucket, anonymous) or when no
  object is found; its reason names the origin's error code and status, never the request,
  the endpoint URL or a credential.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final

import botocore
import botocore.config
import botocore.exceptions
import botocore.session

from localcache.api import originpaths, peer
from localcache.download import peersources

DEFAULT_REGION: Final = "us-east-1"
CONNECT_TIMEOUT_S: Final = 5.0
READ_TIMEOUT_S: Final = 30.0
RETRIES: Final = {"max_attempts": 3, "mode": "standard"}
HEAD_WORKERS: Final = 8
ANONYMOUS_ENV: Final = "awsAnonymousCredential"
_STORAGE_CONFIG_ENV: Final = {  # STORAGE_CONFIG field -> the env var it stands for (KServe)
    "access_key_id": "AWS_ACCESS_KEY_ID",
    "secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "endpoint_url": "AWS_ENDPOINT_URL",
    "region": "AWS_DEFAULT_REGION",
    "anonymous": ANONYMOUS_ENV,
    "verify_ssl": "S3_VERIFY_SSL",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class S3Settings:
    """How this pod reaches the origin (module doc). Credentials never show in its repr."""

    endpoint_url: str | None = None
    region: str = DEFAULT_REGION
    virtual_hosted: bool = False
    verify: bool = True
    ca_bundle: str | None = None
    access_key_id: str | None = dataclasses.field(default=None, repr=False)
    secret_access_key: str | None = dataclasses.field(default=None, repr=False)
    session_token: str | None = dataclasses.field(default=None, repr=False)
    anonymous: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, anonymous_ok: bool = False) -> S3Settings:
        values = {**env, **_storage_config(env)}
        anonymous = values.get(ANONYMOUS_ENV, "").strip().lower() == "true"
        if anonymous and not anonymous_ok:
            raise peersources.use_origin(
                "anonymous S3 access (awsAnonymousCredential) cannot prove access"
            )
        endpoint = values.get("AWS_ENDPOINT_URL") or None
        if endpoint is None and values.get("S3_ENDPOINT"):
            endpoint = values["S3_ENDPOINT"]
            if "://" not in endpoint:
                scheme = "http" if values.get("S3_USE_HTTPS", "").strip() == "0" else "https"
                endpoint = f"{scheme}://{endpoint}"
        virtual = values.get("S3_USER_VIRTUAL_BUCKET", "").strip().lower() in ("true", "1")
        verify = values.get("S3_VERIFY_SSL", "").strip().lower() not in ("0", "false")
        return cls(
            endpoint_url=endpoint,
            region=values.get("AWS_DEFAULT_REGION") or values.get("AWS_REGION") or DEFAULT_REGION,
            virtual_hosted=virtual,
            verify=verify,
            ca_bundle=values.get("AWS_CA_BUNDLE") or None,
            access_key_id=values.get("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=values.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=values.get("AWS_SESSION_TOKEN") or None,
            anonymous=anonymous,
        )

    def client(self) -> Any:
        """A botocore S3 client (no I/O until called); "use origin" for a bad endpoint."""
        config = botocore.config.Config(
            signature_version=botocore.UNSIGNED if self.anonymous else "s3v4",
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            retries=dict(RETRIES),
            s3={"addressing_style": "virtual" if self.virtual_hosted else "path"},
        )
        keys: dict[str, str | None] = {}
        if self.access_key_id and self.secret_access_key and not self.anonymous:  # else the chain
            keys = {
                "aws_access_key_id": self.access_key_id,
                "aws_secret_access_key": self.secret_access_key,
                "aws_session_token": self.session_token,
            }
        try:
            return botocore.session.get_session().create_client(
                "s3",
                region_name=self.region,
                endpoint_url=self.endpoint_url,
                verify=(self.ca_bundle or None) if self.verify else False,
                config=config,
                **keys,
            )
        except (ValueError, botocore.exceptions.BotoCoreError) as exc:
            raise peersources.use_origin(
                f"the S3 origin settings are invalid: {peersources.short(exc)}"
            ) from None


def _storage_config(env: Mapping[str, str]) -> dict[str, str]:
    """The env values a `type: s3` STORAGE_CONFIG entry stands for (KServe sets them)."""
    try:
        entry = json.loads(env.get("STORAGE_CONFIG") or "{}")
        override = json.loads(env.get("STORAGE_OVERRIDE_CONFIG") or "{}")
    except ValueError:
        raise peersources.use_origin(
            "STORAGE_CONFIG or STORAGE_OVERRIDE_CONFIG is not JSON"
        ) from None
    if not isinstance(entry, dict) or not isinstance(override, dict):
        raise peersources.use_origin(
            "STORAGE_CONFIG or STORAGE_OVERRIDE_CONFIG is not a JSON object"
        )
    entry.update(override)
    if entry.get("type") != "s3":
        return {}
    found: dict[str, str] = {}
    for field, name in _STORAGE_CONFIG_ENV.items():
        value = entry.get(field)
        if isinstance(value, bool):
            value = "true" if value else "false"
        if isinstance(value, str | int) and str(value):
            found[name] = str(value)
    return found


@dataclasses.dataclass(frozen=True)
class S3Object:
    path: str
    """Its path in the model folder (`originpaths.s3_folder_path`)."""
    key: str


class S3Origin:
    """The model's origin as this pod's credentials see it (module doc). Blocking calls."""

    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        self._client = settings.client()

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, anonymous_ok: bool = False) -> S3Origin:
        return cls(S3Settings.from_env(env, anonymous_ok=anonymous_ok))

    def objects(self, uri: str) -> list[S3Object]:
        """The model's objects with their folder paths; "use origin" when the origin refuses
        or the listing is empty, too long, or names a path the manifest cannot hold."""
        try:
            bucket, prefix = originpaths.parse_s3(uri)
        except ValueError as exc:
            raise peersources.local_failure(str(exc)) from None
        found: dict[str, S3Object] = {}  # the storage initializer's last write of a path wins
        count = 0
        try:
            pages = self._client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    key = str(item["Key"])
                    if key.endswith("/"):
                        continue
                    count += 1
                    if count > peer.MAX_FILES:
                        raise peersources.use_origin(
                            f"{uri[:80]} holds more than {peer.MAX_FILES} objects"
                        )
                    path = originpaths.s3_folder_path(prefix, key)
                    try:
                        peer.check_path(path)
                    except ValueError:
                        raise peersources.use_origin(
                            f"object {key[:80]!r} has no safe folder path"
                        ) from None
                    found[path] = S3Object(path=path, key=key)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise peersources.use_origin(
                f"the origin refused to list {uri[:80]}: {_origin(exc)}"
            ) from None
        if not found:
            raise peersources.use_origin(f"no object under {uri[:80]}")
        return list(found.values())

    def checksums(self, uri: str, objects: Sequence[S3Object]) -> dict[str, str]:
        """The SHA-256 (hex) the origin stores for each of `objects` stored with a full-object
        one, by folder path (a HEAD in checksum mode each, `HEAD_WORKERS` at once, in daemon
        threads: a caller's deadline never waits for them); "use origin" when it refuses."""
        bucket, _ = originpaths.parse_s3(uri)
        todo: queue.SimpleQueue[S3Object] = queue.SimpleQueue()
        for item in objects:
            todo.put(item)
        sums: dict[str, str] = {}
        answered: list[str] = []
        refused: list[Exception] = []

        def work() -> None:
            while not refused:
                try:
                    item = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    head = self._client.head_object(
                        Bucket=bucket, Key=item.key, ChecksumMode="ENABLED"
                    )
                    sha256 = originpaths.s3_checksum_sha256(
                        head.get("ChecksumSHA256"), head.get("ChecksumType")
                    )
                except Exception as exc:  # any failure: no answer for the whole model
                    refused.append(exc)
                    return
                if sha256 is not None:
                    sums[item.path] = sha256
                answered.append(item.path)

        workers = [
            threading.Thread(target=work, name="localcache-origin-head", daemon=True)
            for _ in range(min(HEAD_WORKERS, len(objects)))
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if refused:
            raise peersources.use_origin(f"the origin refused a HEAD: {_origin(refused[0])}")
        if len(answered) != len(objects):  # never a partial answer taken for a whole one
            raise peersources.use_origin(f"{len(objects) - len(answered)} HEAD(s) not answered")
        return sums

    def proof(self, uri: str, objects: Sequence[S3Object], nonce: str) -> peer.ProofRequest:
        """Presigned HEADs of `objects`, valid `peer.PROOF_EXPIRES_S` from now, signing the
        serving node's `nonce` (`If-None-Match`) and the checksum mode."""
        bucket, _ = originpaths.parse_s3(uri)
        heads: list[peer.ProofHead] = []
        try:
            for item in objects:
                url = self._client.generate_presigned_url(
                    "head_object",
                    Params={
                        "Bucket": bucket,
                        "Key": item.key,
                        "IfNoneMatch": peer.nonce_header(nonce),  # this node's proof only
                        "ChecksumMode": "ENABLED",  # the object's own sha256, if stored
                    },
                    ExpiresIn=peer.PROOF_EXPIRES_S,
                )
                if len(url) > peer.MAX_PROOF_URL:
                    raise peersources.use_origin(
                        f"a presigned HEAD is over {peer.MAX_PROOF_URL} characters"
                    )
                heads.append(peer.ProofHead(path=item.path, url=url))
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise peersources.use_origin(f"cannot presign the proof: {_origin(exc)}") from None
        return peer.ProofRequest(uri=uri, nonce=nonce, heads=heads)


def _origin(exc: Exception) -> str:
    """What the origin or botocore said, without the request (no signature, no key)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return peersources.short(f"{error.get('Code', 'error')} (HTTP {status})")
    # botocore's other errors may quote the endpoint URL the tenant's secret names (with
    # whatever it embeds): the type says enough
    return type(exc).__name__
