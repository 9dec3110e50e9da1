"""AdmissionServer over plain HTTP in-process: review shapes, limits, timeouts, metrics."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import test_utils

from localcache.runtime import metrics
from localcache.runtime.serving import admission
from localcache.runtime.serving import review as review_mod

PATH = "/validate-things"


def review(
    *,
    uid: str = "uid-1",
    operation: str = "CREATE",
    obj: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "namespace": "ns1",
            "name": "cm1",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["devs"], "extra": {"k": ["v"]}},
            "object": obj if obj is not None else {"metadata": {"name": "cm1"}},
            "oldObject": old,
            "dryRun": dry_run,
        },
    }


Client = test_utils.TestClient[Any, Any]


@pytest.fixture
def registry() -> metrics.Metrics:
    return metrics.Metrics()


async def _client(server: admission.AdmissionServer) -> Client:
    client: Client = test_utils.TestClient(test_utils.TestServer(server.app()))
    await client.start_server()
    return client


@pytest.fixture
async def serve(
    registry: metrics.Metrics,
) -> AsyncIterator[Callable[..., Any]]:
    clients: list[Client] = []

    async def start(
        handler: admission.Handler, **kwargs: Any
    ) -> tuple[Client, admission.AdmissionServer]:
        on_failure = kwargs.pop("on_failure", "deny")
        server = admission.AdmissionServer(metrics=registry, **kwargs)
        server.register(PATH, handler, on_failure=on_failure)
        client = await _client(server)
        clients.append(client)
        return client, server

    yield start
    for client in clients:
        await client.close()


async def _allow(req: review_mod.Request) -> review_mod.Response:
    return review_mod.allowed()


async def _post(client: Client, body: Any) -> tuple[int, Any]:
    resp = await client.post(PATH, json=body)
    text = await resp.text()
    try:
        return resp.status, json.loads(text)
    except json.JSONDecodeError:
        return resp.status, text


async def test_response_echoes_the_request_uid(serve: Any) -> None:
    client, _ = await serve(_allow)
    status, body = await _post(client, review(uid="abc-123"))
    assert status == 200
    assert body == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "abc-123", "allowed": True},
    }


async def test_handler_sees_every_request_field(serve: Any) -> None:
    seen: list[review_mod.Request] = []

    async def capture(req: review_mod.Request) -> review_mod.Response:
        seen.append(req)
        return review_mod.allowed()

    client, _ = await serve(capture)
    old = {"metadata": {"name": "cm1", "labels": {"a": "b"}}}
    await _post(client, review(operation="UPDATE", old=old, dry_run=True))
    (req,) = seen
    assert (req.namespace, req.name, req.operation, req.dry_run) == ("ns1", "cm1", "UPDATE", True)
    assert req.kind == review_mod.GroupVersionKind("", "v1", "ConfigMap")
    assert req.resource.resource == "configmaps"
    assert (req.user.username, req.user.groups, dict(req.user.extra)) == (
        "alice",
        ("devs",),
        {"k": ("v",)},
    )
    assert req.object == {"metadata": {"name": "cm1"}}
    assert req.old_object == old


async def test_denial_names_the_field_with_code_and_cause(serve: Any) -> None:
    async def deny(req: review_mod.Request) -> review_mod.Response:
        return review_mod.denied("must be unique, LocalModelCache b has it", field="spec.uri")

    client, _ = await serve(deny)
    status, body = await _post(client, review())
    resp = body["response"]
    assert status == 200
    assert resp["allowed"] is False
    assert resp["status"]["message"] == "spec.uri: must be unique, LocalModelCache b has it"
    assert resp["status"]["code"] == 403
    assert resp["status"]["reason"] == "Forbidden"
    assert resp["status"]["details"]["causes"][0]["field"] == "spec.uri"


async def test_patch_is_base64_jsonpatch_with_warnings(serve: Any) -> None:
    ops = [{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}]

    async def mutate(req: review_mod.Request) -> review_mod.Response:
        return review_mod.patched(ops, warnings=["no copy downloaded yet"])

    client, _ = await serve(mutate)
    _, body = await _post(client, review())
    resp = body["response"]
    assert resp["allowed"] is True
    assert resp["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(resp["patch"])) == ops
    assert resp["warnings"] == ["no copy downloaded yet"]


async def test_an_empty_patch_is_a_plain_allow(serve: Any) -> None:
    async def mutate(req: review_mod.Request) -> review_mod.Response:
        return review_mod.patched([])

    client, _ = await serve(mutate)
    _, body = await _post(client, review())
    assert body["response"] == {"uid": "uid-1", "allowed": True}


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"{not json", "invalid JSON"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}), "v1"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "uid"),
        (json.dumps([1, 2]), "not a JSON object"),
        (json.dumps(review(operation="PATCH")), "operation"),
    ],
)
async def test_malformed_reviews_get_400_and_never_reach_the_handler(
    serve: Any, payload: bytes | str, fragment: str
) -> None:
    called: list[review_mod.Request] = []

    async def record(req: review_mod.Request) -> review_mod.Response:
        called.append(req)
        return review_mod.allowed()

    client, server = await serve(record)
    resp = await client.post(PATH, data=payload, headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert fragment in await resp.text()
    assert called == []
    assert server.stats().count(PATH, "malformed") == 1


async def test_a_request_missing_kind_version_gets_400(serve: Any) -> None:
    body = review()
    del body["request"]["kind"]["version"]
    client, _ = await serve(_allow)
    status, text = await _post(client, body)
    assert status == 400
    assert "incomplete" in text


async def test_a_non_json_content_type_gets_400(serve: Any) -> None:
    client, _ = await serve(_allow)
    resp = await client.post(PATH, data="x", headers={"Content-Type": "text/plain"})
    assert resp.status == 400


async def test_an_oversized_body_gets_413(serve: Any) -> None:
    client, server = await serve(_allow, max_body_bytes=1024)
    big = review(obj={"metadata": {"name": "cm1"}, "data": {"k": "x" * 2048}})
    status, text = await _post(client, big)
    assert status == 413
    assert "1024-byte limit" in text
    assert server.stats().count(PATH, "too_large") == 1


async def test_an_oversized_chunked_body_gets_413(serve: Any) -> None:
    client, _ = await serve(_allow, max_body_bytes=1024)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"x" * 512

    resp = await client.post(PATH, data=chunks(), headers={"Content-Type": "application/json"})
    assert resp.status == 413


async def test_a_body_under_the_limit_is_served(serve: Any) -> None:
    client, _ = await serve(_allow, max_body_bytes=4096)
    status, _ = await _post(client, review(obj={"data": {"k": "x" * 1024}}))
    assert status == 200


async def _hang(req: review_mod.Request) -> review_mod.Response:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_a_handler_timeout_is_a_clear_denial(serve: Any) -> None:
    client, server = await serve(_hang, timeout_s=0.05)
    status, body = await _post(client, review())
    assert status == 200
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["code"] == 504
    assert "did not answer within 0.05s" in body["response"]["status"]["message"]
    assert server.stats().count(PATH, "timeout") == 1


async def test_a_handler_timeout_in_error_mode_answers_504(serve: Any) -> None:
    client, _ = await serve(_hang, timeout_s=0.05, on_failure="error")
    status, text = await _post(client, review())
    assert status == 504
    assert "did not answer" in text


async def test_a_failing_handler_is_denied_with_500(serve: Any) -> None:
    async def boom(req: review_mod.Request) -> review_mod.Response:
        raise RuntimeError("secret detail")

    client, server = await serve(boom)
    _, body = await _post(client, review())
    status = body["response"]["status"]
    assert (status["code"], status["reason"]) == (500, "InternalError")
    assert "RuntimeError" in status["message"]
    assert "secret detail" not in status["message"]
    assert server.stats().count(PATH, "error") == 1


async def test_metrics_count_requests_results_and_latency(
    serve: Any, registry: metrics.Metrics
) -> None:
    async def deny_b(req: review_mod.Request) -> review_mod.Response:
        obj = req.object or {}
        if obj.get("metadata", {}).get("name") == "b":
            return review_mod.denied("no b", field="metadata.name")
        return review_mod.allowed()

    client, server = await serve(deny_b)
    await _post(client, review(obj={"metadata": {"name": "a"}}))
    await _post(client, review(obj={"metadata": {"name": "b"}}))
    await client.post(PATH, data=b"nope", headers={"Content-Type": "application/json"})
    v = registry.value
    assert v("controller_runtime_webhook_requests_total", webhook=PATH, code="200") == 2
    assert v("controller_runtime_webhook_requests_total", webhook=PATH, code="400") == 1
    assert v("localcache_admission_reviews_total", webhook=PATH, result="denied") == 1
    assert v("localcache_admission_reviews_total", webhook=PATH, result="allowed") == 1
    assert v("controller_runtime_webhook_latency_seconds_count", webhook=PATH) == 3
    assert v("controller_runtime_webhook_requests_in_flight", webhook=PATH) == 0
    assert server.stats().count(PATH) == 3


def test_registering_a_path_twice_is_refused() -> None:
    server = admission.AdmissionServer(metrics=metrics.Metrics())
    server.register(PATH, _allow)
    with pytest.raises(ValueError, match="already registered"):
        server.register(PATH, _allow)
    with pytest.raises(ValueError, match="must start with"):
        server.register("relative", _allow)


# ------------------------------------------------------------------------ JSON patch


def _apply(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A minimal RFC 6902 add/replace/remove applier for objects, enough for these tests."""
    doc = copy.deepcopy(doc)
    for op in ops:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        parent = doc
        for t in tokens[:-1]:
            parent = parent[t]
        last = tokens[-1]
        if op["op"] == "remove":
            del parent[last]
        elif op["op"] == "replace":
            assert last in parent, op
            parent[last] = op["value"]
        else:
            parent[last] = op["value"]
    return doc


def test_escape_pointer_escapes_tilde_before_slash() -> None:
    assert review_mod.escape_pointer("a~/b") == "a~0~1b"


def test_metadata_patch_adds_replaces_and_removes_with_escaped_keys() -> None:
    obj = {
        "metadata": {
            "labels": {"internal.serving.kserve.io/localmodel": "old", "keep": "x"},
            "annotations": {"stale/key": "v"},
        }
    }
    ops = review_mod.metadata_patch(
        obj,
        labels={"internal.serving.kserve.io/localmodel": "new", "a~b": "1", "gone": None},
        annotations={"stale/key": None, "x/y": "z"},
    )
    assert {"op": "replace", "path": "/metadata/labels/internal.serving.kserve.io~1localmodel",
            "value": "new"} in ops  # fmt: skip
    assert {"op": "add", "path": "/metadata/labels/a~0b", "value": "1"} in ops
    result = _apply(obj, ops)
    assert result["metadata"] == {
        "labels": {"internal.serving.kserve.io/localmodel": "new", "keep": "x", "a~b": "1"},
        "annotations": {"x/y": "z"},
    }


def test_metadata_patch_creates_missing_maps_and_metadata() -> None:
    ops = review_mod.metadata_patch({}, labels={"a/b": "1"}, annotations={"gone": None})
    assert _apply({}, ops) == {"metadata": {"labels": {"a/b": "1"}}}


def test_metadata_patch_is_empty_when_nothing_differs() -> None:
    obj = {"metadata": {"labels": {"a": "1"}}}
    assert (
        review_mod.metadata_patch(obj, labels={"a": "1", "b": None}, annotations={"c": None}) == []
    )
