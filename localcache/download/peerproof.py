"""Cross-scope proofs, the fetcher's side: before a peer of another credential scope serves
this download pod, its agent runs, at the S3 origin, presigned HEADs this pod produced for
every file of the model (`localcache fetch --prove-s3`; the serving side is
`agent.peer.proofs`).

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
  proves nothing: "use origin".
- `S3Origin(settings)`: a botocore client (SigV4, connect `CONNECT_TIMEOUT_S`, read
  `READ_TIMEOUT_S`, standard retries). `objects(uri)` lists `s3://bucket/prefix`
  (ListObjectsV2, paginated, keys ending in "/" skipped, at most `peer.MAX_FILES`) and maps
  each key to its folder path as the storage initializer does (`peer.s3_folder_path`); `proof(uri,
  objects)` presigns a HEAD of each (`peer.PROOF_EXPIRES_S`). Both block: run them in a thread.
- `prove(request, board, uri=, origin=)`: lists once, then asks every live source of `board`
  (at once, each with a fresh presign) `POST /p2p/v1/models/{key}/proofs` over the fetcher's
  TLS session (`peerfetch.session`) with the bearer token. A 200 `proven` answer (whose
  digest, if any, is the one asked for) keeps the source; any other answer bans it for the
  run (`Board.ban`, in rank order once all have answered) with the status and the answer's
  reason: 429 is asked again up to `PROOF_ATTEMPTS` times in all (Retry-After honoured, at
  most `MAX_BUSY_WAIT_S`); 403, 409, 5xx, a transport or TLS failure, an answer over
  `MAX_ANSWER_BYTES` or one that does not parse are refusals. The whole proof runs within
  `request.deadline`, each POST within `PROOF_TIMEOUT_S`.
- Errors: `peersources.FetchError`. "Use origin" when the origin refuses or cannot serve the
  listing or presign (no credentials, AccessDenied, no such bucket, anonymous), when no object
  is found, and when no source accepts the proof (its reason lists theirs); a local failure
  (an unreadable token file) otherwise. `peer.parse_s3` raises `ValueError`.
- Never logged or put in a reason: credentials and presigned URLs (they carry signatures);
  only counts, node names, statuses and the peers' reasons.
Not promised: that a source which accepted serves the files (the transfer checks them), nor
that the listing is the one the origin Job would see later (objects may change meanwhile).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
from collections.abc import Mapping, Sequence
from typing import Any, Final

import aiohttp
import botocore.config
import botocore.exceptions
import botocore.session
import pydantic
import structlog
import yarl

from localcache.api import peer
from localcache.download import peerfetch, peersources

log = structlog.get_logger(__name__)

DEFAULT_REGION: Final = "us-east-1"
CONNECT_TIMEOUT_S: Final = 5.0
READ_TIMEOUT_S: Final = 30.0
RETRIES: Final = {"max_attempts": 3, "mode": "standard"}
PROOF_ATTEMPTS: Final = 3
MAX_BUSY_WAIT_S: Final = 5.0
PROOF_TIMEOUT_S: Final = 600.0
"""One POST: the serving node runs the HEADs at once, then may hash the model (MD5, once per
folder) before it answers."""
MAX_ANSWER_BYTES: Final = 4096
ANONYMOUS_ENV: Final = "awsAnonymousCredential"
_STORAGE_CONFIG_ENV: Final = {  # STORAGE_CONFIG field -> the env var it stands for (KServe)
    "access_key_id": "AWS_ACCESS_KEY_ID",
    "secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "endpoint_url": "AWS_ENDPOINT_URL",
    "region": "AWS_DEFAULT_REGION",
    "anonymous": ANONYMOUS_ENV,
    "verify_ssl": "S3_VERIFY_SSL",
}
_use_origin = peersources.use_origin


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

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> S3Settings:
        values = {**env, **_storage_config(env)}
        if values.get(ANONYMOUS_ENV, "").strip().lower() == "true":
            raise _use_origin("anonymous S3 access (awsAnonymousCredential) cannot prove access")
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
        )

    def client(self) -> Any:
        """A botocore S3 client (no I/O until called); "use origin" for a bad endpoint."""
        config = botocore.config.Config(
            signature_version="s3v4",
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            retries=dict(RETRIES),
            s3={"addressing_style": "virtual" if self.virtual_hosted else "path"},
        )
        keys: dict[str, str | None] = {}
        if self.access_key_id and self.secret_access_key:  # else botocore's default chain
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
            raise _use_origin(f"the S3 origin settings are invalid: {_short(exc)}") from None


def _storage_config(env: Mapping[str, str]) -> dict[str, str]:
    """The env values a `type: s3` STORAGE_CONFIG entry stands for (KServe sets them)."""
    try:
        entry = json.loads(env.get("STORAGE_CONFIG") or "{}")
        override = json.loads(env.get("STORAGE_OVERRIDE_CONFIG") or "{}")
    except ValueError:
        raise _use_origin("STORAGE_CONFIG or STORAGE_OVERRIDE_CONFIG is not JSON") from None
    if not isinstance(entry, dict) or not isinstance(override, dict):
        raise _use_origin("STORAGE_CONFIG or STORAGE_OVERRIDE_CONFIG is not a JSON object")
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
    """Its path in the model folder (`peer.s3_folder_path`)."""
    key: str


class S3Origin:
    """The model's origin as this pod's credentials see it (module doc). Blocking calls."""

    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        self._client = settings.client()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> S3Origin:
        return cls(S3Settings.from_env(env))

    def objects(self, uri: str) -> list[S3Object]:
        """The model's objects with their folder paths; "use origin" when the origin refuses
        or the listing is empty, too long, or names a path the manifest cannot hold."""
        try:
            bucket, prefix = peer.parse_s3(uri)
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
                        raise _use_origin(f"{uri[:80]} holds more than {peer.MAX_FILES} objects")
                    path = peer.s3_folder_path(prefix, key)
                    try:
                        peer.check_path(path)
                    except ValueError:
                        raise _use_origin(f"object {key[:80]!r} has no safe folder path") from None
                    found[path] = S3Object(path=path, key=key)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise _use_origin(f"the origin refused to list {uri[:80]}: {_origin(exc)}") from None
        if not found:
            raise _use_origin(f"no object under {uri[:80]}")
        return list(found.values())

    def proof(self, uri: str, objects: Sequence[S3Object]) -> peer.ProofRequest:
        """Presigned HEADs of `objects`, valid `peer.PROOF_EXPIRES_S` from now."""
        bucket, _ = peer.parse_s3(uri)
        heads: list[peer.ProofHead] = []
        try:
            for item in objects:
                url = self._client.generate_presigned_url(
                    "head_object",
                    # the origin then answers the object's own sha256, if stored with one
                    Params={"Bucket": bucket, "Key": item.key, "ChecksumMode": "ENABLED"},
                    ExpiresIn=peer.PROOF_EXPIRES_S,
                )
                if len(url) > peer.MAX_PROOF_URL:
                    raise _use_origin(f"a presigned HEAD is over {peer.MAX_PROOF_URL} characters")
                heads.append(peer.ProofHead(path=item.path, url=url))
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise _use_origin(f"cannot presign the proof: {_origin(exc)}") from None
        return peer.ProofRequest(uri=uri, heads=heads)


async def prove(
    request: peerfetch.Request, board: peersources.Board, *, uri: str, origin: S3Origin
) -> None:
    """Prove access to `uri` to every live source of `board` (module doc); the sources that
    refuse are banned; "use origin" when none accepts."""
    if not board.live():
        raise _use_origin("no peer source given")
    try:
        async with asyncio.timeout(request.deadline):
            objects = await asyncio.to_thread(origin.objects, uri)
            log.info("fetch.proof_listed", objects=len(objects), sources=len(board.live()))
            async with peerfetch.session(request) as client, asyncio.TaskGroup() as group:
                proof = _Proof(request, client, uri=uri, origin=origin, objects=objects)
                asked = {
                    source: group.create_task(
                        proof.to(source), name=f"localcache-proof-{source.node}"
                    )
                    for source in board.live()
                }
    except TimeoutError:
        raise _use_origin(
            f"the proof did not finish within {request.deadline:g} s (--deadline)"
        ) from None
    except BaseExceptionGroup as errors:
        raise peersources.first_error(errors) from None
    for source, task in asked.items():  # in rank order, whichever answered first
        why = task.result()
        if why is not None:
            board.ban(source, f"proof refused: {why}")
    if not board.live():
        raise _use_origin(f"no peer accepted the proof: {board.why_banned()}")


class _Proof:
    def __init__(
        self,
        request: peerfetch.Request,
        client: aiohttp.ClientSession,
        *,
        uri: str,
        origin: S3Origin,
        objects: list[S3Object],
    ) -> None:
        self.request = request
        self.client = client
        self.uri = uri
        self.origin = origin
        self.objects = objects

    async def to(self, source: peersources.Source) -> str | None:
        """Prove to `source`: None when it accepts, else why not."""
        for attempt in range(1, PROOF_ATTEMPTS + 1):
            body = await asyncio.to_thread(self._body)  # signed afresh: they live 60 s
            status, answer, wait = await self._post(source, body)
            if status == 429 and attempt < PROOF_ATTEMPTS:
                await self.request.clock.sleep(min(wait, MAX_BUSY_WAIT_S))
                continue
            break
        why = _refusal(status, answer, self.request.digest)
        if why is None:
            log.info("fetch.proof_accepted", source=source.node, files=len(self.objects))
        else:
            log.info("fetch.proof_refused", source=source.node, reason=why, attempts=attempt)
        return why

    def _body(self) -> bytes:
        proof = self.origin.proof(self.uri, self.objects)
        return proof.model_dump_json(by_alias=True).encode()

    async def _post(
        self, source: peersources.Source, body: bytes
    ) -> tuple[int | str, peer.ProofAnswer | str, float]:
        """(status or a transport failure, the answer or its text, Retry-After)."""
        url = f"{source.url}{peer.WIRE_PREFIX}/models/{self.request.storage_key}/proofs"
        timeout = aiohttp.ClientTimeout(
            total=PROOF_TIMEOUT_S,
            connect=self.request.connect_timeout,
            sock_connect=self.request.connect_timeout,
        )
        headers = {
            **self.request.credentials.headers(),
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
        }
        try:
            async with self.client.post(
                yarl.URL(url, encoded=True),
                data=body,
                headers=headers,
                ssl=self.request.credentials.ssl,
                server_hostname=self.request.server_name,
                allow_redirects=False,
                timeout=timeout,
            ) as resp:
                wait = peersources.retry_after(resp.headers.get("Retry-After"), fallback=1.0)
                raw = bytearray()
                async for chunk in resp.content.iter_chunked(MAX_ANSWER_BYTES):
                    raw += chunk
                    if len(raw) > MAX_ANSWER_BYTES:
                        return resp.status, f"an answer over {MAX_ANSWER_BYTES} bytes", wait
        except (ssl.SSLError, aiohttp.ClientSSLError) as exc:
            return "TLS", peersources.short(exc), 0.0
        except (aiohttp.ClientError, TimeoutError) as exc:
            return "transport", peersources.short(exc) or "timed out", 0.0
        try:
            return resp.status, peer.ProofAnswer.model_validate_json(raw), wait
        except pydantic.ValidationError:  # e.g. the server's plain-text refusals
            return resp.status, bytes(raw).decode("utf-8", "replace"), wait


def _refusal(status: int | str, answer: peer.ProofAnswer | str, digest: str) -> str | None:
    """None when `answer` accepts the proof (for `digest`); else a short reason."""
    if isinstance(answer, peer.ProofAnswer):
        if status == 200 and answer.proven:
            if answer.digest is None or digest in (peer.FOLLOW, answer.digest):
                return None
            return "HTTP 200, proven for another digest"
        said = answer.reason or ""
    else:
        said = answer
    head = f"HTTP {status}" if isinstance(status, int) else status
    said = _short(said)[:80]
    return f"{head} ({said})" if said else head


def _origin(exc: Exception) -> str:
    """What the origin or botocore said, without the request (no signature, no key)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return _short(f"{error.get('Code', 'error')} (HTTP {status})")
    # botocore's other errors may quote the endpoint URL the tenant's secret names (with
    # whatever it embeds): the type says enough
    return type(exc).__name__


def _short(text: object) -> str:
    """One printable line of at most 160 characters (no control characters from a peer)."""
    printable = "".join(c if c.isprintable() else " " for c in str(text))
    return " ".join(printable.split())[:160]
