"""AdmissionReview `admission.k8s.io/v1` as data: the request a handler reads and the response
it returns, with no HTTP in sight (the server is `runtime.serving.admission`).

- `Request.from_review()` parses a review's `request` (raising `MalformedReview`); `Response`
  renders itself as the answering review (`review(uid)`).
- `allowed()`, `denied()` and `patched()` build responses; `metadata_patch()` builds the
  JSON-patch ops that make an object's labels and annotations match; `escape_pointer()` is one
  RFC 6901 reference token.

Contract: `Response.review(uid)` is always an AdmissionReview carrying `uid`; a denial with a
`field` names it in `status.details.causes`. Not promised: any validation of the patch ops
against the object (the apiserver applies them).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

API_VERSION = "admission.k8s.io/v1"

JsonObject = dict[str, Any]
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class MalformedReview(ValueError):
    """The body is not an AdmissionReview this server can answer."""


@dataclass(frozen=True, slots=True)
class GroupVersionKind:
    group: str
    version: str
    kind: str


@dataclass(frozen=True, slots=True)
class GroupVersionResource:
    group: str
    version: str
    resource: str


@dataclass(frozen=True, slots=True)
class UserInfo:
    username: str = ""
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Request:
    """The parts of an AdmissionRequest a handler reads. Objects are plain dicts (None when the
    operation has none: `object` on DELETE, `old_object` on CREATE)."""

    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    namespace: str
    name: str
    operation: Operation
    user: UserInfo
    object: JsonObject | None
    old_object: JsonObject | None
    dry_run: bool = False
    sub_resource: str = ""
    options: JsonObject | None = None

    def log_context(self) -> dict[str, str]:
        """uid, kind, namespace, name and operation, for structured logs."""
        return {"uid": self.uid, "kind": self.kind.kind, "namespace": self.namespace,
                "name": self.name, "operation": self.operation}  # fmt: skip

    @classmethod
    def from_review(cls, review: Any) -> Request:
        """Parse a decoded AdmissionReview; raise MalformedReview saying what is wrong."""
        if not isinstance(review, dict):
            raise MalformedReview("body is not a JSON object")
        if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
            raise MalformedReview(f"expected an AdmissionReview of apiVersion {API_VERSION}")
        req = review.get("request")
        if not isinstance(req, dict) or not isinstance(req.get("uid"), str) or not req["uid"]:
            raise MalformedReview("AdmissionReview has no request with a uid")
        op = req.get("operation")
        if op not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
            raise MalformedReview(f"request.operation {op!r} is not an admission operation")
        try:
            kind, res, user = _dict(req, "kind"), _dict(req, "resource"), _dict(req, "userInfo")
            extra = {k: tuple(v) for k, v in (user.get("extra") or {}).items()}
            return cls(
                uid=req["uid"],
                kind=GroupVersionKind(kind.get("group", ""), kind["version"], kind["kind"]),
                resource=GroupVersionResource(
                    res.get("group", ""), res["version"], res["resource"]
                ),
                namespace=req.get("namespace") or "",
                name=req.get("name") or "",
                operation=op,
                user=UserInfo(
                    user.get("username", ""),
                    user.get("uid", ""),
                    tuple(user.get("groups") or ()),
                    extra,
                ),
                object=_optional_dict(req, "object"),
                old_object=_optional_dict(req, "oldObject"),
                dry_run=bool(req.get("dryRun")),
                sub_resource=req.get("subResource") or "",
                options=_optional_dict(req, "options"),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise MalformedReview(f"AdmissionReview request is incomplete: {exc!r}") from exc


def _dict(obj: JsonObject, key: str) -> JsonObject:
    value = obj.get(key) or {}
    if not isinstance(value, dict):
        raise TypeError(f"request.{key} is not an object")
    return value


def _optional_dict(obj: JsonObject, key: str) -> JsonObject | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"request.{key} is not an object")
    return value


@dataclass(frozen=True, slots=True)
class Response:
    """An AdmissionResponse without its uid (added by `review()`)."""

    allowed: bool
    message: str = ""
    code: int = 200
    reason: str = ""
    field: str = ""
    warnings: tuple[str, ...] = ()
    patch: tuple[JsonObject, ...] = ()

    def review(self, uid: str) -> JsonObject:
        """The AdmissionReview answering the request `uid`."""
        resp: JsonObject = {"uid": uid, "allowed": self.allowed}
        if not self.allowed:
            status: JsonObject = {"status": "Failure", "message": self.message, "code": self.code}
            if self.reason:
                status["reason"] = self.reason
            if self.field:
                cause = {
                    "type": "FieldValueForbidden",
                    "field": self.field,
                    "message": self.message,
                }
                status["details"] = {"causes": [cause]}
            resp["status"] = status
        if self.warnings:
            resp["warnings"] = list(self.warnings)
        if self.patch:
            resp["patchType"] = "JSONPatch"
            resp["patch"] = base64.b64encode(json.dumps(list(self.patch)).encode()).decode()
        return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": resp}

    @property
    def result(self) -> str:
        return "patched" if self.patch else ("allowed" if self.allowed else "denied")


def allowed(*, warnings: Iterable[str] = ()) -> Response:
    return Response(True, warnings=tuple(warnings))


def denied(
    message: str,
    *,
    field: str = "",
    code: int = 403,
    reason: str = "Forbidden",
    warnings: Iterable[str] = (),
) -> Response:
    """A denial; with `field`, the message starts with it (`spec.x: ...`) and names it in
    `status.details.causes`, as Kubernetes field errors do."""
    text = f"{field}: {message}" if field and not message.startswith(field) else message
    return Response(False, text, code, reason, field, tuple(warnings))


def patched(ops: Sequence[JsonObject], *, warnings: Iterable[str] = ()) -> Response:
    """Allowed with a JSONPatch; no ops is a plain `allowed`."""
    return Response(True, warnings=tuple(warnings), patch=tuple(ops))


def escape_pointer(token: str) -> str:
    """One JSON-pointer reference token (RFC 6901): `~` → `~0`, `/` → `~1`."""
    return token.replace("~", "~0").replace("/", "~1")


def metadata_patch(
    obj: JsonObject,
    *,
    labels: Mapping[str, str | None] | None = None,
    annotations: Mapping[str, str | None] | None = None,
) -> list[JsonObject]:
    """JSON-patch ops that make `obj`'s labels/annotations match: a value sets the key, None
    removes it when present. Keys already as wanted produce no op."""
    meta = obj.get("metadata") or {}
    ops: list[JsonObject] = []
    if "metadata" not in obj and (labels or annotations):
        ops.append({"op": "add", "path": "/metadata", "value": {}})
    for section, wanted in (("labels", labels or {}), ("annotations", annotations or {})):
        current = meta.get(section)
        to_set = {k: v for k, v in wanted.items() if v is not None and (current or {}).get(k) != v}
        if current is None:
            if to_set:
                ops.append({"op": "add", "path": f"/metadata/{section}", "value": to_set})
            continue
        for key, value in wanted.items():
            path = f"/metadata/{section}/{escape_pointer(key)}"
            if value is None and key in current:
                ops.append({"op": "remove", "path": path})
            elif key in to_set:
                ops.append(
                    {"op": "replace" if key in current else "add", "path": path, "value": value}
                )
    return ops
