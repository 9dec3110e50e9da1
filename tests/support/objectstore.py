"""An S3-compatible object store that enforces credentials (moto's server): a TEST HARNESS.

The end-to-end test bed stores models in it as an `s3://` source, possibly from inside a
network namespace of its own, so it is a subprocess that Python starts (no Docker):

    python -m tests.support.objectstore --host H --port P

How credentials are enforced: moto checks signatures and IAM policies once
`INITIAL_NO_AUTH_ACTION_COUNT` (read from the environment when moto is imported) actions have
gone unauthenticated; before that, every action is let through. `ObjectStore.start` sets it to
`BOOTSTRAP_ACTIONS` (3) and spends exactly those on creating the admin (CreateUser,
PutUserPolicy allowing `*`, CreateAccessKey); from then on every S3 and IAM request must be
SigV4-signed with the access key of a user moto knows, whose policies allow the action. Start
then checks that a request signed with an unknown key is refused, and fails loudly if not.

The server is moto's WSGI app behind a small guard, because moto alone lets through what a
credentials test must not: it answers `/moto-api/*` (which can reset the auth count or every
backend) to anyone, and it fails unsigned listings and presigned URLs with 500. The guard
answers 403 (S3 XML error `AccessDenied`; no body for a HEAD) for `/moto-api/*` and for any
request without an `Authorization` header or SigV4 query parameters; it checks presigned
requests itself and hands them to moto header-signed by the same key (`presign`). It answers
`GET /_objectstore/ready` itself (no action counted), and `GET /_objectstore/stats` with
`{"requests": N, "bytesSent": M, "heldChecksumHeads": H}`: the signed (or presigned) requests
passed to moto, the response body bytes it sent for them (counters that only grow; the
data-plane benchmark reads the origin's egress there) and the HEADs it held (`s3holds`: it
answers checksum-mode HEADs late when asked, `hold_checksum_heads`).

Contract of `ObjectStore` (the harness side):
- `start()` returns once the server answers, the admin exists and enforcement was checked;
  otherwise it raises `ObjectStoreError` with the log's tail and leaves nothing running.
- Refused requests answer HTTP 403: unsigned (`AccessDenied`), unknown key
  (`InvalidAccessKeyId`), wrong secret (`SignatureDoesNotMatch`), action not allowed by the
  user's policies (`AccessDenied`).
- SigV4 presigned URLs of IAM users' keys run as on S3, with the user's permissions, until
  `X-Amz-Expires` s (at most a week) after `X-Amz-Date`, then 403 `AccessDenied` "Request has
  expired"; another method, path or query, or a wrong secret: `SignatureDoesNotMatch` (the
  rest is in `presign`). `presigned_head` and `presigned_get` make them with botocore.
- Its own calls use boto3, signed with the admin key, path-style addressing, region
  `us-east-1`, connect/read timeouts and at most `MAX_ATTEMPTS` attempts per call.
- `stop()` ends the process group and waits; it is idempotent. All data is in memory and is
  gone with the process.
Not promised: anonymous access of any kind (refused), SigV2 presigned URLs (refused as
unsigned), presigned URLs with temporary credentials, bucket policies or ACLs granting public
reads, virtual-hosted-style addressing, TLS, persistence, moto's fidelity to S3 beyond the
calls used here.

Errors: `ObjectStoreError(modelserver.ServerError)` for start-up failures; S3 and IAM refusals
surface as `botocore.exceptions.ClientError`.
"""

from __future__ import annotations

import argparse
import base64
import http
import json
import os
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import boto3
import botocore.config
import botocore.exceptions

from localcache.devenv import modelserver, processes
from tests.support import presign, s3holds

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

REGION = "us-east-1"
BOOTSTRAP_ACTIONS = 3  # CreateUser + PutUserPolicy + CreateAccessKey of the admin
ADMIN_USER = "localcache-admin"
READY_PATH = "/_objectstore/ready"
STATS_PATH = "/_objectstore/stats"
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
MAX_ATTEMPTS = 2

ALLOW_ALL: Mapping[str, Any] = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
}
S3_FULL_ACCESS: Mapping[str, Any] = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}


class ObjectStoreError(modelserver.ServerError):
    """The object store did not start, or does not enforce credentials."""


class AccessKey(NamedTuple):
    """An IAM user's access key: unpacks as (access_key_id, secret_access_key)."""

    access_key_id: str
    secret_access_key: str


# ---- the server (runs in the subprocess) ------------------------------------------------


_CONTROL_API = presign.Refusal(403, "AccessDenied", "The moto control API is disabled.")
_UNSIGNED = presign.Refusal(403, "AccessDenied", "Requests must be signed (no anonymous access).")


def _refuse(start: StartResponse, refusal: presign.Refusal, *, head: bool) -> list[bytes]:
    """`refusal` as an S3 XML error (its message is ours, never the request's); no body for
    a HEAD."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{refusal.code}</Code><Message>{refusal.message}</Message></Error>"
    ).encode()
    start(
        f"{refusal.status} {http.HTTPStatus(refusal.status).phrase}",
        [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
    )
    return [] if head else [body]


class _Sent:
    """What the guard passed to moto and the body bytes moto answered (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.bytes = 0

    def counted(self, body: Iterable[bytes]) -> Iterator[bytes]:
        with self.lock:
            self.requests += 1
        try:
            for chunk in body:
                with self.lock:
                    self.bytes += len(chunk)
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()

    def json(self, *, held: int) -> bytes:
        with self.lock:
            found = {"requests": self.requests, "bytesSent": self.bytes}
        return json.dumps({**found, "heldChecksumHeads": held}).encode()


def guard(app: WSGIApplication, *, secret_of: presign.Secrets) -> WSGIApplication:
    """Wrap moto's app: refuse `/moto-api/*` and unsigned requests, check presigned ones
    (finding keys' secrets with `secret_of`), answer READY_PATH and STATS_PATH, count what
    moto sends, hold checksum-mode HEADs when asked (`s3holds`)."""
    sent, holds = _Sent(), s3holds.Holds()

    def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Any:
        path = environ.get("PATH_INFO", "")
        if path == READY_PATH:
            start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "3")])
            return [b"ok\n"]
        answered = holds.control(environ, start_response)
        if answered is not None:
            return answered
        if path == STATS_PATH:
            body = sent.json(held=holds.held)
            start_response(
                "200 OK",
                [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
            )
            return [body]
        head = environ.get("REQUEST_METHOD") == "HEAD"
        if path.startswith("/moto-api"):
            return _refuse(start_response, _CONTROL_API, head=head)
        if presign.is_presigned(environ):
            try:
                presign.authenticate(environ, secret_of=secret_of)
            except presign.Refusal as refusal:
                return _refuse(start_response, refusal, head=head)
        elif not environ.get("HTTP_AUTHORIZATION"):
            return _refuse(start_response, _UNSIGNED, head=head)
        holds.wait(environ)
        return sent.counted(app(environ, start_response))

    return guarded


def serve(host: str, port: int) -> None:
    """Serve moto behind `guard` on host:port until SIGTERM (see the module docstring)."""
    if "INITIAL_NO_AUTH_ACTION_COUNT" not in os.environ:
        raise SystemExit("INITIAL_NO_AUTH_ACTION_COUNT must be set: it turns on moto's IAM auth")
    os.environ.setdefault("MOTO_PORT", str(port))
    # moto reads its settings when imported: import it only here, in the server process.
    from moto.moto_server import werkzeug_app
    from werkzeug.serving import run_simple

    app = werkzeug_app.DomainDispatcherApplication(werkzeug_app.create_backend_app)
    run_simple(
        host,
        port,
        guard(app, secret_of=presign.moto_secret),
        threaded=True,
        request_handler=werkzeug_app.MotoRequestHandler,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.objectstore")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", required=True, type=int)
    args = parser.parse_args(argv)
    serve(args.host, args.port)
    return 0


# ---- the harness side ----------------------------------------------------------------


def client_config() -> Any:
    """The botocore Config of every client here: timeouts, bounded retries, path style."""
    return botocore.config.Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"mode": "standard", "total_max_attempts": MAX_ATTEMPTS},
        s3={"addressing_style": "path"},
    )


def status_of(error: botocore.exceptions.ClientError) -> tuple[int, str]:
    """(HTTP status, AWS error code) of a refused call."""
    response: Mapping[str, Any] = error.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


@dataclass
class ObjectStore(modelserver.ServerProcess):
    """moto's S3 and IAM in a subprocess, requiring signed requests from known users.

    `start()` launches it (after `argv_prefix`, e.g. an `nsenter` into a network namespace)
    bound to host:port; `host` must be reachable from this process, which bootstraps the
    admin over HTTP. With `port=None` a port free on this host's loopback is picked: pass a
    port when the server runs in another namespace. See the module docstring for the rest.
    """

    region: str = REGION
    log_path: Path | None = None
    admin: AccessKey | None = field(default=None, init=False)

    def start(
        self,
        argv_prefix: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int | None = None,
        *,
        reach: str | None = None,
    ) -> ObjectStore:
        """`reach`: the URL this process uses when host:port is not reachable from it (the
        server runs in another network namespace behind a forwarder)."""

        def command(port: int) -> processes.ManagedProcess:
            log_path = self.log_path or Path(tempfile.mkdtemp(prefix="localcache-s3-")) / "log"
            argv = [*argv_prefix, sys.executable, "-m", __name__, "--host", host]
            env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(BOOTSTRAP_ACTIONS)}
            return processes.ManagedProcess(
                "objectstore", [*argv, "--port", str(port)], log_path, env=env
            )

        def then() -> None:
            self.admin = self._bootstrap()
            self._check_enforced()

        self._launch(
            command,
            host=host,
            port=port,
            reach=reach,
            ready_path=READY_PATH,
            what="object store",
            error=ObjectStoreError,
            then=then,
        )
        return self

    def stop(self) -> None:
        super().stop()
        self.admin = None

    @property
    def endpoint(self) -> str:
        """The S3 (and IAM) endpoint URL this process uses, e.g. `http://127.0.0.1:40123`."""
        return self._own_url

    def client(
        self, service: str = "s3", key: AccessKey | None = None, *, config: Any = None
    ) -> Any:
        """A boto3 client of `service` signed with `key` (default: the admin's), configured
        by `config` (default: `client_config()`). Ignores the environment's and ~/.aws's
        credentials."""
        key = key or self._admin()
        session = boto3.session.Session(
            aws_access_key_id=key.access_key_id,
            aws_secret_access_key=key.secret_access_key,
            region_name=self.region,
        )
        return session.client(service, endpoint_url=self.endpoint, config=config or client_config())

    def presigned_head(
        self,
        bucket: str,
        key: str,
        *,
        key_id: str,
        secret: str,
        expires_s: int = 60,
        endpoint: str | None = None,
    ) -> str:
        """A SigV4 presigned `HeadObject` URL of bucket/key, made by botocore with that access
        key (path style, `region`, `endpoint`, or the `endpoint` URL others reach this store
        at: the host is signed), valid for `expires_s` seconds."""
        return self._presign(
            "head_object", bucket, key, access=AccessKey(key_id, secret), expires_s=expires_s,
            endpoint=endpoint,
        )  # fmt: skip

    def presigned_get(
        self, bucket: str, key: str, *, key_id: str, secret: str, expires_s: int = 60
    ) -> str:
        """As `presigned_head`, for `GetObject`."""
        return self._presign(
            "get_object", bucket, key, access=AccessKey(key_id, secret), expires_s=expires_s
        )

    def create_user(self, name: str, *, policy: Mapping[str, Any] | None = None) -> AccessKey:
        """A new IAM user with `policy` (default: `s3:*` on `*`) and a fresh access key."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        iam.put_user_policy(
            UserName=name,
            PolicyName="localcache-test-policy",
            PolicyDocument=json.dumps(dict(policy or S3_FULL_ACCESS)),
        )
        created = iam.create_access_key(UserName=name)["AccessKey"]
        return AccessKey(created["AccessKeyId"], created["SecretAccessKey"])

    def create_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)

    def put_object(
        self,
        bucket: str,
        key: str,
        data: bytes,
        *,
        sha256: bool = False,
        stored_sha256: str | None = None,
    ) -> None:
        """Store `data`; with `sha256`, with its SHA-256 checksum (S3 then answers it to a
        HEAD in checksum mode, `x-amz-checksum-sha256`); with `stored_sha256` (hex), with that
        as its checksum instead: a store whose record is not the bytes (S3 would refuse the
        upload, moto keeps it)."""
        extra: dict[str, str] = {"ChecksumAlgorithm": "SHA256"} if sha256 else {}
        if stored_sha256 is not None:
            claimed = base64.b64encode(bytes.fromhex(stored_sha256)).decode()
            extra = {"ChecksumAlgorithm": "SHA256", "ChecksumSHA256": claimed}
        self.client().put_object(Bucket=bucket, Key=key, Body=data, **extra)

    def get_object(self, bucket: str, key: str) -> bytes:
        body: bytes = self.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    def list_keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key under `prefix`, in S3's (lexicographic) order."""
        paginator = self.client().get_paginator("list_objects_v2")
        return [
            obj["Key"]
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix)
            for obj in page.get("Contents", [])
        ]

    def bytes_sent(self) -> tuple[int, int]:
        """(requests, response body bytes) the store served so far (`STATS_PATH`)."""
        found = self._stats()
        return int(found["requests"]), int(found["bytesSent"])

    def _stats(self) -> dict[str, Any]:
        status, body = modelserver.http_get(self.endpoint + STATS_PATH)
        if status != 200:
            raise ObjectStoreError(f"GET {STATS_PATH}: HTTP {status}")
        return dict(json.loads(body))

    def hold_checksum_heads(self, bucket: str, prefix: str) -> None:
        """Hold the checksum-mode HEADs of `bucket`'s objects under `prefix` (`s3holds`)."""
        s3holds.hold(self.endpoint, bucket, prefix)

    def release_checksum_heads(self) -> None:
        s3holds.release(self.endpoint)

    def checksum_heads_held(self) -> int:
        """How many checksum-mode HEADs were held so far."""
        return int(self._stats()["heldChecksumHeads"])

    def s3_env(self, key: AccessKey) -> dict[str, str]:
        """Environment for KServe's storage initializer (or any boto3 client) to download
        with `key`: endpoint, credentials, region, plain HTTP, path-style addressing."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": key.access_key_id,
            "AWS_SECRET_ACCESS_KEY": key.secret_access_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "S3_USE_HTTPS": "0",
            "S3_VERIFY_SSL": "0",
            "S3_USER_VIRTUAL_BUCKET": "false",
        }

    def _presign(
        self,
        operation: str,
        bucket: str,
        key: str,
        *,
        access: AccessKey,
        expires_s: int,
        endpoint: str | None = None,
    ) -> str:
        sigv4 = client_config().merge(botocore.config.Config(signature_version="s3v4"))
        session = boto3.session.Session(
            aws_access_key_id=access.access_key_id,
            aws_secret_access_key=access.secret_access_key,
            region_name=self.region,
        )
        client = session.client("s3", endpoint_url=endpoint or self.endpoint, config=sigv4)
        url: str = client.generate_presigned_url(
            operation, Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_s
        )
        return url

    def _admin(self) -> AccessKey:
        if self.admin is None:
            raise ObjectStoreError("object store not started")
        return self.admin

    def _bootstrap(self) -> AccessKey:
        """Spend the BOOTSTRAP_ACTIONS unauthenticated actions on the admin user and key."""
        anyone = AccessKey("bootstrap", "bootstrap")
        iam = self.client("iam", anyone)
        try:
            iam.create_user(UserName=ADMIN_USER)
            iam.put_user_policy(
                UserName=ADMIN_USER,
                PolicyName="localcache-admin",
                PolicyDocument=json.dumps(ALLOW_ALL),
            )
            created = iam.create_access_key(UserName=ADMIN_USER)["AccessKey"]
        except botocore.exceptions.ClientError as e:
            raise ObjectStoreError(
                f"bootstrap of the admin failed (were unauthenticated actions spent "
                f"elsewhere?): {e}\n{self._log_tail()}"
            ) from e
        return AccessKey(created["AccessKeyId"], created["SecretAccessKey"])

    def _check_enforced(self) -> None:
        unknown = AccessKey("AKIAUNKNOWNKEY000000", "not-a-secret")
        try:
            self.client("s3", unknown).list_buckets()
        except botocore.exceptions.ClientError as e:
            if status_of(e)[0] == 403:
                return
            raise ObjectStoreError(f"unknown key answered {status_of(e)}, not 403") from e
        raise ObjectStoreError("credentials are not enforced: an unknown key could list buckets")

    def _log_tail(self) -> str:
        return self.process.log_tail() if self.process is not None else "(no log)"


if __name__ == "__main__":
    sys.exit(main())
