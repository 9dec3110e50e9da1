"""Why a download failed, as it may be published: the gist of a download container's
termination message, and the sanitising every pod-supplied text goes through. Pure.

Download containers run with `terminationMessagePolicy: FallbackToLogsOnError` (the agent's
download Jobs and the controller's import Jobs): KServe's storage initializer writes no
termination message, so the kubelet takes the tail of its log (at most 80 lines, 2048 bytes).
A log tail is a tenant's pod output and must never be copied into the cluster-scoped
LocalModelNode status or an Event, so:

- `gist(text)` recognises the failures that matter to an operator (an S3 store or an HTTP
  server refusing access, a 404, an archive refused for a member outside its destination or
  not an archive at all, a URI no storage type recognises, no space left, no connection) and
  answers a phrase of a FIXED vocabulary (`GISTS`), never any of the input's own text; ""
  when nothing is recognised. First match wins, in `_RULES` order (archive before 403/404:
  a refused archive's traceback may name files that contain such numbers).
- `sanitise(text)` is for a message a container wrote deliberately (`File` policy, e.g. a
  ClusterStorageContainer image of the cluster admin's): its last non-blank line, without
  control characters, URL userinfo, query strings (presigned URLs carry credentials there)
  or `key=value` pairs whose key looks secret, at most `limit` characters.
- `pod_waiting_message(pods)`: why a download pod that has not finished cannot start (the
  kubelet's reason and message for an image it cannot pull, a Secret it cannot find, or the
  scheduler's for no fitting node), sanitised the same way.

Not promised: that every failure is recognised (an unrecognised one reads "Error (exit code
N)", as the container's state says, and the pod's log has the rest).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

Obj = dict[str, Any]

POD_MESSAGE_LIMIT: Final = 256
MESSAGE_LIMIT: Final = 1024

GIST_S3_FORBIDDEN: Final = "403 Forbidden from the S3 store"
GIST_FORBIDDEN: Final = "403 Forbidden"
GIST_UNAUTHORIZED: Final = "401 Unauthorized: the credentials were refused"
GIST_NOT_FOUND: Final = "404 Not Found"
GIST_ARCHIVE_OUTSIDE: Final = "archive refused: a member would land outside the model folder"
GIST_ARCHIVE_INVALID: Final = "archive refused: not a valid tar or zip archive"
GIST_INVALID_URI: Final = "invalid URI: no storage type recognises it"
GIST_NO_SPACE: Final = "no space left on device"
GIST_OOM: Final = "out of memory"
GIST_CONTENT_TYPE: Final = "the HTTP server answered an unexpected Content-Type"
GIST_CONNECT: Final = "could not connect to the model's source"

_I = re.IGNORECASE
_RULES: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    (
        re.compile(
            r"OutsideDestinationError|AbsolutePathError|AbsoluteLinkError"
            r"|LinkOutsideDestinationError|outside the destination|path traversal",
            _I,
        ),
        GIST_ARCHIVE_OUTSIDE,
    ),
    (
        re.compile(r"Failed to unpack archive|BadZipFile|ReadError: .*(tar|gzip)|not a gzip", _I),
        GIST_ARCHIVE_INVALID,
    ),
    (
        re.compile(r"Cannot recognize storage type|invalid (storage )?ur[il]\b", _I),
        GIST_INVALID_URI,
    ),
    (re.compile(r"No space left on device|ENOSPC", _I), GIST_NO_SPACE),
    (re.compile(r"\bMemoryError\b|OOMKilled", _I), GIST_OOM),
    (
        re.compile(
            r"S3 (error \[(403|AccessDenied)\]|access denied)|Access denied to S3"
            r"|Verify S3 permissions|\(AccessDenied\) when calling|\(403\) when calling",
            _I,
        ),
        GIST_S3_FORBIDDEN,
    ),
    (
        re.compile(
            r"authentication failed|InvalidAccessKeyId|SignatureDoesNotMatch|\(401\)"
            r"|\b401 Unauthorized|status code 401",
            _I,
        ),
        GIST_UNAUTHORIZED,
    ),
    (
        re.compile(r"access denied|\b403 Forbidden|status code 403|HTTP Error 403", _I),
        GIST_FORBIDDEN,
    ),
    (
        re.compile(
            r"resource not found|\b404 Not Found|status code 404|HTTP Error 404|NoSuchKey"
            r"|NoSuchBucket|does not exist|No model found|\(404\) when calling",
            _I,
        ),
        GIST_NOT_FOUND,
    ),
    (re.compile(r"did not respond with (any of following )?'Content-Type'", _I), GIST_CONTENT_TYPE),
    (
        re.compile(
            r"Failed to connect|Connection refused|connection failed|Name or service not known"
            r"|Temporary failure in name resolution|timed out|ConnectTimeout",
            _I,
        ),
        GIST_CONNECT,
    ),
)
GISTS: Final = frozenset(phrase for _pattern, phrase in _RULES)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]*@")
_QUERY = re.compile(r"(?P<url>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s?#'\"]*)\?[^\s#'\"]*")
_SECRET_PAIR = re.compile(
    r"(?P<key>[A-Za-z0-9_.-]*(?:secret|token|password|passwd|credential|signature|"
    r"access[_-]?key|session)[A-Za-z0-9_.-]*)(?P<sep>\s*[=:]\s*)(?P<value>[^\s,;&'\"]+)",
    _I,
)


def gist(text: str | None) -> str:
    """The fixed phrase for the failure `text` shows ("" when none is recognised)."""
    if not text:
        return ""
    for pattern, phrase in _RULES:
        if pattern.search(text):
            return phrase
    return ""


def clip(text: str, limit: int = MESSAGE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sanitise(text: object, *, limit: int = POD_MESSAGE_LIMIT) -> str:
    """A deliberately written message as it may be published (see the module docstring)."""
    line = one_line(text, limit=len(str(text)) + 1) if text is not None else ""
    line = _USERINFO.sub(r"\g<scheme>", line)
    line = _QUERY.sub(r"\g<url>?<redacted>", line)
    line = _SECRET_PAIR.sub(r"\g<key>\g<sep><redacted>", line)
    return clip(line, limit)


def one_line(text: object, *, limit: int = POD_MESSAGE_LIMIT) -> str:
    """A pod-supplied text as it may be published: its last non-blank line, without control
    characters, at most `limit` characters ("" for nothing)."""
    if text is None:
        return ""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return clip(" ".join(_CONTROL.sub(" ", lines[-1]).split()) if lines else "", limit)


def pod_failure_message(pods: Iterable[Obj], *, job_uid: str | None = None) -> str:
    """What the newest failed pod (of the Job `job_uid`, when given: its controller
    ownerReference) says: the first failed init container's (an import pod's download runs
    as one; those that exited 0 are passed over), else its containers' in order: the gist of
    the termination message (`gist`)
    with the reason and exit code; a message the container wrote itself (`File` policy) as
    `sanitise` publishes it; never a log tail (`FallbackToLogsOnError`) as such; else
    the pod's own message or reason; "" when no pod failed."""
    failed = [
        p
        for p in pods
        if (p.get("status") or {}).get("phase") == "Failed"
        and (job_uid is None or _controller_uid(p) == job_uid)
    ]
    failed.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    for pod in reversed(failed):
        status = pod.get("status") or {}
        policies, sidecars = _message_policies(pod), _sidecars(pod)
        for container in status.get("initContainerStatuses") or []:
            term = (container.get("state") or {}).get("terminated") or {}
            if term.get("exitCode") == 0 or container.get("name") in sidecars:
                continue  # an init step that succeeded; a sidecar, stopped (never the cause)
            if text := _container_message(term, policies.get(str(container.get("name")))):
                return text
        for container in status.get("containerStatuses") or []:
            term = (container.get("state") or {}).get("terminated") or {}
            if text := _container_message(term, policies.get(str(container.get("name")))):
                return text
        if text := sanitise(status.get("message") or status.get("reason")):
            return text
    return ""


STUCK_REASONS: Final = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
})  # fmt: skip
"""Why a container waits that it will not get over by itself (a wrong image, a missing Secret
or ConfigMap key): pulling and creating are not among them."""


def pod_waiting_message(
    pods: Iterable[Obj], *, job_uid: str | None = None, detail: bool = True
) -> str:
    """Why the newest pod (of the Job `job_uid`, when given) that has not finished cannot
    start: a container waiting for a `STUCK_REASONS` reason, or the pod unschedulable, as
    "<reason>: <message>" (`detail=False`: the reason only); "" when it is on its way."""
    alive = [
        p
        for p in pods
        if (p.get("status") or {}).get("phase") in ("Pending", None)
        and (job_uid is None or _controller_uid(p) == job_uid)
    ]
    alive.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    for pod in reversed(alive):
        status = pod.get("status") or {}
        for container in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_REASONS:
                return _said(waiting["reason"], waiting.get("message") if detail else None)
        for condition in status.get("conditions") or []:
            if (condition.get("type"), condition.get("status")) == ("PodScheduled", "False"):
                said = condition.get("message") if detail else None
                return _said("Unschedulable", said)
        return ""
    return ""


def _said(reason: object, message: object) -> str:
    text = sanitise(message)
    return f"{one_line(reason, limit=64)}: {text}" if text else one_line(reason, limit=64)


def _container_message(term: Obj, policy: str | None) -> str:
    """One terminated container's failure, as it may be published ("" for nothing)."""
    raw = term.get("message")
    found = gist(str(raw)) if raw else ""
    code = one_line(term.get("exitCode"), limit=8) or "?"
    if found:
        return f"{found} (exit code {code})"
    if policy != "FallbackToLogsOnError" and (text := sanitise(raw)):
        return text
    if term.get("reason") or term.get("exitCode"):
        reason = one_line(term.get("reason"), limit=64) or "Error"
        return f"{reason} (exit code {code})"
    return ""


def _sidecars(pod: Obj) -> set[str]:
    """The names of the pod's sidecars (init containers with `restartPolicy: Always`): the
    kubelet stops them when the pod ends, so their exit (137 when killed at the end of the
    pod's grace) never says why the pod failed."""
    spec = pod.get("spec") or {}
    return {
        str(c.get("name"))
        for c in spec.get("initContainers") or []
        if isinstance(c, dict) and c.get("restartPolicy") == "Always"
    }


def _message_policies(pod: Obj) -> dict[str, str]:
    """Each container's `terminationMessagePolicy` (Kubernetes' default is `File`)."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    return {
        str(c.get("name")): str(c.get("terminationMessagePolicy") or "File")
        for c in containers
        if isinstance(c, dict)
    }


def _controller_uid(obj: Obj) -> str | None:
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("controller"):
            return str(owner.get("uid") or "")
    return None
