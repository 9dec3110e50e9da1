"""SigV4 query-string authentication (presigned URLs) for the test object store: a TEST HARNESS.

moto checks only the `Authorization` header (it fails presigned requests with 500), so
`objectstore.guard` calls `authenticate(environ, secret_of=...)` for every request whose
query carries `X-Amz-Algorithm`, `X-Amz-Credential` or `X-Amz-Signature` (`is_presigned`),
before moto sees it.

Contract of `authenticate`:
- It checks, in this order, and raises `Refusal` at the first fault:
  1. the form, else 400 `AuthorizationQueryParametersError`: no `Authorization` header too
     (400 `InvalidArgument`), each auth parameter once, algorithm `AWS4-HMAC-SHA256`,
     credential `<key id>/<yyyymmdd>/<region>/s3/aws4_request` of the day of `X-Amz-Date`
     (`yyyymmddThhmmssZ`), `0 <= X-Amz-Expires <= MAX_EXPIRES_S`, `X-Amz-SignedHeaders`;
  2. the key: `secret_of(key id, region)` knows it, else 403 `InvalidAccessKeyId`;
  3. the signature (SigV4 query auth for S3: the method, the path URI-encoded once, the query
     without `X-Amz-Signature`, the headers `X-Amz-SignedHeaders` names, `UNSIGNED-PAYLOAD`),
     compared in constant time, else 403 `SignatureDoesNotMatch`;
  4. the time: `now()` at most `X-Amz-Expires` s after `X-Amz-Date`, else 403 `AccessDenied`
     "Request has expired"; at most `MAX_SKEW_S` s before it, else 403 `AccessDenied`
     "Request is not valid yet".
- Then it rewrites `environ` in place into the same request signed in its `Authorization`
  header by the same key (botocore's `S3SigV4Auth`, dated now, `UNSIGNED-PAYLOAD`): same
  method, body and other headers, the path in its canonical encoding, the query without the
  `AUTH_PARAMS`. moto checks that signature and the key's IAM policies as for any signed
  request, so the request runs with the permissions of the key's user.
- `secret_of` is called once per request, from the server's request threads. `moto_secret`
  is the server's: moto's own lookup, IAM users' keys only; call it only in the process that
  serves moto (importing moto reads its settings).
Not promised: temporary credentials (an `X-Amz-Security-Token` is passed on to moto, which
refuses it with a user's key), SigV2 presigned URLs (`AWSAccessKeyId`, `Signature`: the guard
refuses them as unsigned), a signed payload, S3's checks of the region or of unsigned
`x-amz-*` headers, S3's order when a request has several faults.

Errors: `Refusal(Exception)` with the HTTP status, S3 error code and message to answer;
nothing else is raised for a bad request.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import os
import time
import urllib.parse
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final

import botocore.auth
import botocore.awsrequest
import botocore.config
import botocore.credentials

ALGORITHM: Final = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD: Final = "UNSIGNED-PAYLOAD"
MAX_EXPIRES_S: Final = 604800  # a week, S3's limit
MAX_SKEW_S: Final = 900  # how far in the future X-Amz-Date may be
AUTH_PARAMS: Final = frozenset(
    {
        "X-Amz-Algorithm",
        "X-Amz-Credential",
        "X-Amz-Date",
        "X-Amz-Expires",
        "X-Amz-SignedHeaders",
        "X-Amz-Signature",
        "X-Amz-Security-Token",
    }
)
REQUIRED_PARAMS: Final = AUTH_PARAMS - {"X-Amz-Security-Token"}
_MARKERS: Final = frozenset({"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature"})
_AMZ_DATE: Final = "%Y%m%dT%H%M%SZ"

Secrets = Callable[[str, str], str | None]
"""(access key id, region) -> that key's secret, or None for a key nobody has."""


class Refusal(Exception):
    """What to answer instead of running the request: HTTP status, S3 error code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class _Form:
    key_id: str
    scope: str  # <yyyymmdd>/<region>/s3/aws4_request
    region: str
    amz_date: str
    signed_at: int  # X-Amz-Date, seconds since the epoch
    expires_s: int
    signed_headers: str
    signature: str
    token: str | None


def is_presigned(environ: MutableMapping[str, Any]) -> bool:
    """Whether the request's query carries SigV4 query authentication."""
    return any(urllib.parse.unquote(n) in _MARKERS for n, _ in _pairs(environ))


def authenticate(
    environ: MutableMapping[str, Any],
    *,
    secret_of: Secrets,
    now: Callable[[], float] = time.time,
) -> None:
    """Verify the request's query signature and rewrite `environ` into the same request
    header-signed by the same key, or raise `Refusal` (see the module docstring)."""
    if environ.get("HTTP_AUTHORIZATION"):
        raise Refusal(
            400,
            "InvalidArgument",
            "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, "
            "Signature query string parameter or the Authorization header should be specified",
        )
    pairs = _pairs(environ)
    form = _form(pairs)
    secret = secret_of(form.key_id, form.region)
    if secret is None:
        raise Refusal(
            403,
            "InvalidAccessKeyId",
            "The AWS Access Key Id you provided does not exist in our records.",
        )
    credentials = botocore.credentials.Credentials(form.key_id, secret, form.token)
    path = urllib.parse.quote(str(environ.get("PATH_INFO", "")).encode("latin-1"), safe="/~")
    canonical = _canonical_request(environ, path, pairs, form.signed_headers)
    string_to_sign = "\n".join(
        [ALGORITHM, form.amz_date, form.scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    stub = botocore.awsrequest.AWSRequest()
    stub.context["timestamp"] = form.amz_date
    expected: str = botocore.auth.S3SigV4Auth(credentials, "s3", form.region).signature(
        string_to_sign, stub
    )
    if not hmac.compare_digest(expected.encode(), form.signature.encode()):
        raise Refusal(
            403,
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. "
            "Check your key and signing method.",
        )
    at = now()
    if at > form.signed_at + form.expires_s:
        raise Refusal(403, "AccessDenied", "Request has expired")
    if at < form.signed_at - MAX_SKEW_S:
        raise Refusal(403, "AccessDenied", "Request is not valid yet")
    query = "&".join(f"{n}={v}" for n, v in pairs if urllib.parse.unquote(n) not in AUTH_PARAMS)
    _sign_in_header(environ, path=path, query=query, credentials=credentials, form=form)


def moto_secret(key_id: str, region: str) -> str | None:
    """The secret of an IAM user's key as moto finds it when it checks a signature
    (`moto.iam.access_control.IAMUserAccessKey`, in the account moto picks for the key)."""
    from moto.iam import access_control, models
    from moto.utilities import utils

    account = os.environ.get("MOTO_ACCOUNT_ID") or models.get_account_id_from(key_id)
    try:
        key = access_control.IAMUserAccessKey(
            account_id=account,
            partition=utils.get_partition(region),
            access_key_id=key_id,
            headers={},
        )
    except access_control.CreateAccessKeyFailure:
        return None
    secret: str = key.create_credentials().secret_key
    return secret


def _pairs(environ: MutableMapping[str, Any]) -> list[tuple[str, str]]:
    """The query's (name, value) pairs as sent (still percent-encoded), in order."""
    query = str(environ.get("QUERY_STRING", ""))
    return [(n, v) for n, _, v in (p.partition("=") for p in query.split("&") if p)]


def _malformed(message: str) -> Refusal:
    return Refusal(400, "AuthorizationQueryParametersError", message)


def _form(pairs: list[tuple[str, str]]) -> _Form:
    auth: dict[str, str] = {}
    for name, value in pairs:
        decoded = urllib.parse.unquote(name)
        if decoded in AUTH_PARAMS:
            if decoded in auth:
                raise _malformed(f"{decoded} must be given once.")
            auth[decoded] = urllib.parse.unquote(value)
    missing = sorted(REQUIRED_PARAMS - {n for n, v in auth.items() if v})
    if missing:
        raise _malformed(f"Query-string authentication requires {', '.join(missing)}.")
    if auth["X-Amz-Algorithm"] != ALGORITHM:
        raise _malformed(f"X-Amz-Algorithm only supports {ALGORITHM}.")
    amz_date = auth["X-Amz-Date"]
    try:
        signed_at = calendar.timegm(time.strptime(amz_date, _AMZ_DATE))
        expires_s = int(auth["X-Amz-Expires"])
    except ValueError:
        raise _malformed("X-Amz-Date or X-Amz-Expires is malformed.") from None
    if not 0 <= expires_s <= MAX_EXPIRES_S:
        raise _malformed(
            f"X-Amz-Expires must be non-negative and less than a week (in seconds) that is; "
            f"{MAX_EXPIRES_S}"
        )
    key_id, slash, scope = auth["X-Amz-Credential"].partition("/")
    parts = scope.split("/")
    if not (key_id and slash and len(parts) == 4 and parts[2:] == ["s3", "aws4_request"]):
        raise _malformed(
            "Error parsing the X-Amz-Credential parameter; "
            "expected <key id>/<yyyymmdd>/<region>/s3/aws4_request."
        )
    if parts[0] != amz_date[:8]:
        raise _malformed("The date of X-Amz-Credential is not the date of X-Amz-Date.")
    return _Form(
        key_id=key_id,
        scope=scope,
        region=parts[1],
        amz_date=amz_date,
        signed_at=signed_at,
        expires_s=expires_s,
        signed_headers=auth["X-Amz-SignedHeaders"],
        signature=auth["X-Amz-Signature"],
        token=auth.get("X-Amz-Security-Token"),
    )


def _encode(raw: str) -> str:
    """A query name or value as SigV4 encodes it (unreserved characters kept)."""
    return urllib.parse.quote(urllib.parse.unquote_to_bytes(raw), safe="-_.~")


def _canonical_request(
    environ: MutableMapping[str, Any],
    path: str,
    pairs: list[tuple[str, str]],
    signed_headers: str,
) -> str:
    query = "&".join(
        f"{n}={v}"
        for n, v in sorted(
            (_encode(n), _encode(v))
            for n, v in pairs
            if urllib.parse.unquote(n) != "X-Amz-Signature"
        )
    )
    headers = []
    for name in signed_headers.split(";"):
        special = {"content-type": "CONTENT_TYPE", "content-length": "CONTENT_LENGTH"}
        value = environ.get(special.get(name, "HTTP_" + name.upper().replace("-", "_")))
        if value is None:  # a signed header the request lacks: not the request signed
            raise Refusal(
                403,
                "SignatureDoesNotMatch",
                f"The request lacks a header it signed ({name}).",
            )
        headers.append(f"{name}:{' '.join(str(value).split())}\n")
    method = str(environ.get("REQUEST_METHOD", "GET"))
    return "\n".join([method, path, query, "".join(headers), signed_headers, UNSIGNED_PAYLOAD])


def _sign_in_header(
    environ: MutableMapping[str, Any],
    *,
    path: str,
    query: str,
    credentials: Any,
    form: _Form,
) -> None:
    """Make `environ` the same request signed by `credentials` in its Authorization header."""
    uri = path + (f"?{query}" if query else "")
    host = str(environ.get("HTTP_HOST", ""))
    request = botocore.awsrequest.AWSRequest(
        method=environ.get("REQUEST_METHOD", "GET"), url=f"http://{host}{uri}", headers={}
    )
    request.headers["host"] = host
    request.context["client_config"] = botocore.config.Config(
        s3={"payload_signing_enabled": False}  # the body is not read here: UNSIGNED-PAYLOAD
    )
    botocore.auth.S3SigV4Auth(credentials, "s3", form.region).add_auth(request)
    for name, value in request.headers.items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    environ["QUERY_STRING"] = query
    # moto signs and routes over the path as it arrived (RAW_URI): make it this one.
    environ["RAW_URI"] = environ["REQUEST_URI"] = uri
