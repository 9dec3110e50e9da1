"""The peer authorizer's decisions over a fake API: who is served, who is refused and why,
and what is cached."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Mapping
from typing import Any

import pytest

from localcache.agent.peer import auth
from localcache.runtime import clock

Obj = dict[str, Any]
KEY = "0123456789abcdef"
SCOPE = "a" * 64
NOW = 1_800_000_000.0


def jwt(exp: float | None = NOW + 600) -> str:
    claims = {} if exp is None else {"exp": int(exp)}
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{body}.sig"


def review(
    *,
    ns: str = "jobs",
    pod: str = "dl-1",
    uid: str = "pod-uid",
    audiences: list[str] | None = None,
    authenticated: bool = True,
) -> Obj:
    return {
        "authenticated": authenticated,
        "audiences": ["localcache-peer"] if audiences is None else audiences,
        "user": {
            "username": f"system:serviceaccount:{ns}:default",
            "extra": {
                "authentication.kubernetes.io/pod-name": [pod],
                "authentication.kubernetes.io/pod-uid": [uid],
            },
        },
    }


def pod(*, uid: str = "pod-uid", owner: Obj | None = None, node: str = "node-b") -> Obj:
    ref: Obj = {"apiVersion": "batch/v1", "kind": "Job", "name": "job-1", "uid": "job-uid"}
    ref |= {"controller": True}
    return {
        "metadata": {
            "name": "dl-1",
            "namespace": "jobs",
            "uid": uid,
            "ownerReferences": [owner if owner is not None else ref],
        },
        "spec": {"nodeName": node},
    }


def record(**changes: str) -> Obj:
    base = {
        "namespace": "jobs",
        "name": "job-1",
        "uid": "job-uid",
        "statusKey": "m",
        "storageKey": KEY,
        "scope": SCOPE,
        "attempt": 0,
    }
    return base | changes


def node(*records: Obj, name: str = "node-b") -> Obj:
    return {"metadata": {"name": name}, "status": {"downloadJobs": list(records)}}


class FakeApi:
    def __init__(
        self, status: Obj | None = None, pods: list[Obj] | None = None, lmn: Obj | None = None
    ) -> None:
        self.status = review() if status is None else status
        self.pods = [pod()] if pods is None else pods
        self.lmn = node(record()) if lmn is None else lmn
        self.calls: list[str] = []
        self.gate: asyncio.Event | None = None
        self.fail = False

    async def review_token(self, token: str) -> Mapping[str, Any]:
        self.calls.append("review")
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise auth.Unavailable("down")
        return self.status

    async def list_pods(self, namespace: str, name: str) -> list[Obj]:
        self.calls.append(f"pods {namespace}/{name}")
        return self.pods

    async def get_node(self, name: str) -> Obj | None:
        self.calls.append(f"node {name}")
        return self.lmn if self.lmn.get("metadata", {}).get("name") == name else None


def authorizer(api: FakeApi, fake: clock.FakeClock | None = None, **kw: Any) -> auth.Authorizer:
    return auth.Authorizer(api, clock=fake or clock.FakeClock(), wall=lambda: NOW, **kw)


async def test_a_recorded_jobs_pod_is_served() -> None:
    api = FakeApi()
    got = await authorizer(api).authorize(jwt(), KEY, frozenset({SCOPE}))
    assert got == auth.Requester(
        namespace="jobs", pod="dl-1", job="job-1", node="node-b", scope=SCOPE
    )
    assert api.calls == ["review", "pods jobs/dl-1", "node node-b"]


SA_USER = {"username": "system:serviceaccount:jobs:default"}
RS_OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "u"}
JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "job-1", "uid": "job-uid"}
CASES: list[tuple[str, FakeApi, str, int]] = [
    ("unauthenticated", FakeApi(status=review(authenticated=False)), "bad-token", 401),
    ("other audience", FakeApi(status=review(audiences=["api"])), "wrong-audience", 401),
    ("a user", FakeApi(status={**review(), "user": {"username": "alice"}}), "not-a-pod", 403),
    ("no pod extras", FakeApi(status={**review(), "user": SA_USER}), "not-a-pod", 403),
    ("pod gone", FakeApi(pods=[]), "pod-gone", 403),
    ("pod replaced", FakeApi(pods=[pod(uid="other")]), "pod-gone", 403),
    ("not owned", FakeApi(pods=[pod(owner={})]), "not-a-download-job", 403),
    (
        "owned by a ReplicaSet",
        FakeApi(pods=[pod(owner=RS_OWNER | {"controller": True})]),
        "not-a-download-job",
        403,
    ),
    ("Job not controller", FakeApi(pods=[pod(owner=JOB_OWNER)]), "not-a-download-job", 403),
    ("forged Job uid", FakeApi(lmn=node(record(uid="real-uid"))), "untrusted-job", 403),
    ("other namespace", FakeApi(lmn=node(record(namespace="x"))), "untrusted-job", 403),
    ("no LocalModelNode", FakeApi(lmn=node(record(), name="node-z")), "untrusted-job", 403),
    ("no node name", FakeApi(pods=[pod(node="")]), "untrusted-job", 403),
    ("other key", FakeApi(lmn=node(record(storageKey="f" * 16))), "wrong-key", 403),
    ("other scope", FakeApi(lmn=node(record(scope="b" * 64))), "other-scope", 403),
]


@pytest.mark.parametrize(
    ("api", "reason", "status"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_refusals_name_their_reason(api: FakeApi, reason: str, status: int) -> None:
    got = await authorizer(api).authorize(jwt(), KEY, frozenset({SCOPE}))
    assert got == auth.Refusal(status, reason)  # type: ignore[arg-type]


@pytest.mark.parametrize("token", [None, ""])
async def test_no_token_is_refused_without_api_calls(token: str | None) -> None:
    api = FakeApi()
    got = await authorizer(api).authorize(token, KEY, frozenset({SCOPE}))
    assert got == auth.Refusal(401, "no-token")
    assert api.calls == []


@pytest.mark.parametrize("token", ["a.b." + "c" * 20000, "not a jwt", "a.b.c\n", "ä.b.c"])
async def test_oversized_or_malformed_tokens_are_refused_without_api_calls(token: str) -> None:
    api = FakeApi()
    got = await authorizer(api).authorize(token, KEY, frozenset({SCOPE}))
    assert got == auth.Refusal(401, "bad-token")
    assert api.calls == []


async def test_lookups_of_different_tokens_are_bounded() -> None:
    api = FakeApi()
    api.gate = asyncio.Event()
    authz = authorizer(api, max_concurrent_lookups=2)
    tasks = [
        asyncio.create_task(
            authz.authorize(jwt(exp=NOW + 600 + n), KEY, frozenset({SCOPE})), name=f"authz-{n}"
        )
        for n in range(5)
    ]
    for _ in range(5):
        await asyncio.sleep(0)
    assert api.calls.count("review") == 2
    api.gate.set()
    await asyncio.gather(*tasks)
    assert api.calls.count("review") == 5


async def test_decisions_are_cached_and_scopes_checked_each_time() -> None:
    api, fake = FakeApi(), clock.FakeClock()
    authz = authorizer(api, fake)
    token = jwt()
    assert isinstance(await authz.authorize(token, KEY, frozenset({SCOPE})), auth.Requester)
    assert await authz.authorize(token, KEY, frozenset({"c" * 64})) == auth.Refusal(
        403, "other-scope"
    )
    assert api.calls.count("review") == 1
    await fake.advance(59)
    await authz.authorize(token, KEY, frozenset({SCOPE}))
    assert api.calls.count("review") == 1
    await fake.advance(2)  # past 60 s
    await authz.authorize(token, KEY, frozenset({SCOPE}))
    assert api.calls.count("review") == 2


async def test_an_identity_is_not_cached_past_the_tokens_expiry() -> None:
    api, fake = FakeApi(), clock.FakeClock()
    authz = authorizer(api, fake)
    token = jwt(exp=NOW + 5)
    await authz.authorize(token, KEY, frozenset({SCOPE}))
    await fake.advance(6)
    await authz.authorize(token, KEY, frozenset({SCOPE}))
    assert api.calls.count("review") == 2


async def test_refusals_are_cached_ten_seconds() -> None:
    api, fake = FakeApi(pods=[]), clock.FakeClock()
    authz = authorizer(api, fake)
    for _ in range(3):
        await authz.authorize(jwt(), KEY, frozenset({SCOPE}))
    assert api.calls.count("review") == 1
    api.pods = [pod()]
    await fake.advance(11)
    assert isinstance(await authz.authorize(jwt(), KEY, frozenset({SCOPE})), auth.Requester)


async def test_the_cache_is_per_token_and_key_and_bounded() -> None:
    api = FakeApi()
    authz = authorizer(api, max_entries=3)
    for n in range(5):
        await authz.authorize(jwt(exp=NOW + 600 + n), KEY, frozenset({SCOPE}))
    await authz.authorize(jwt(), "f" * 16, frozenset({SCOPE}))
    assert authz.cached == 3
    assert api.calls.count("review") == 6


async def test_concurrent_identical_lookups_share_one() -> None:
    api = FakeApi()
    api.gate = asyncio.Event()
    authz = authorizer(api)
    token = jwt()
    tasks = [
        asyncio.create_task(authz.authorize(token, KEY, frozenset({SCOPE})), name=f"authz-{n}")
        for n in range(5)
    ]
    await asyncio.sleep(0)
    api.gate.set()
    results = await asyncio.gather(*tasks)
    assert all(isinstance(r, auth.Requester) for r in results)
    assert api.calls.count("review") == 1


async def test_an_unreachable_apiserver_is_no_decision_and_not_cached() -> None:
    api = FakeApi()
    api.fail = True
    authz = authorizer(api)
    with pytest.raises(auth.Unavailable):
        await authz.authorize(jwt(), KEY, frozenset({SCOPE}))
    api.fail = False
    assert isinstance(await authz.authorize(jwt(), KEY, frozenset({SCOPE})), auth.Requester)


def test_token_expiry_reads_the_exp_claim_only_when_present() -> None:
    assert auth.token_expiry(jwt(exp=NOW)) == NOW
    assert auth.token_expiry(jwt(exp=None)) is None
    assert auth.token_expiry("not-a-jwt") is None
    assert auth.token_expiry("a.!!!.c") is None
