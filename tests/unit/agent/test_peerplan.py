"""The peer planner (`agent.peerplan`): sources, ranking, fan-out, scopes, digests, seeds."""

from __future__ import annotations

from typing import Any

from localcache.agent import peerplan
from localcache.api import modelnode, peer

KEY = "0123456789abcdef"
SCOPE = "a" * 64
OTHER_SCOPE = "b" * 64
D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
ME = "node-m"


def _node(
    name: str,
    *,
    models: list[dict[str, Any]] | None = None,
    endpoint: str | None = "https://10.0.0.1:8476",
    lists: bool = True,
    state: str | None = None,
    progress: dict[str, dict[str, Any]] | None = None,
    states: dict[str, str] | None = None,
    jobs: list[dict[str, Any]] | None = None,
    unservable: list[dict[str, Any]] | None = None,
) -> modelnode.LocalModelNode:
    status: dict[str, Any] = {}
    if models is not None or endpoint is not None:
        status["peer"] = {"endpoint": endpoint, "models": models, "unservable": unservable}
    all_states = dict(states or {})
    if state is not None:
        all_states["iris"] = state
    if all_states:
        status["modelStatus"] = all_states
    if progress:
        status["modelProgress"] = progress
    if jobs:
        status["downloadJobs"] = jobs
    local = [{"sourceModelUri": "s3://b/iris", "modelName": "iris", "nodeGroup": "g"}]
    return modelnode.LocalModelNode.model_validate(
        {
            "metadata": {"name": name},
            "spec": {"localModels": local if lists else []},
            "status": status,
        }
    )


def _model(digest: str = D1, scopes: tuple[str, ...] = (SCOPE,)) -> dict[str, Any]:
    return {"storageKey": KEY, "digest": digest, "scopes": list(scopes), "bytes": 10}


def _fetching_from(parent: str, n: int, name: str) -> modelnode.LocalModelNode:
    keys = [f"m{i}" for i in range(n)]
    return _node(
        name,
        endpoint=None,
        lists=False,
        states=dict.fromkeys(keys, "ModelDownloading"),
        progress={k: {"source": f"peer/{parent}"} for k in keys},
    )


def _req(*members: modelnode.LocalModelNode, **kw: Any) -> peerplan.Request:
    fields: dict[str, Any] = {
        "storage_key": KEY,
        "scope": SCOPE,
        "node_name": ME,
        "status_key": "iris",
        "spec": peer.PeerDistributionSpec(enabled=True),
        "members": [_node(ME, endpoint=None), *members],
        **kw,
    }
    return peerplan.Request(**fields)


def test_a_node_serving_the_model_in_the_scope_is_a_source() -> None:
    decision = peerplan.plan(_req(_node("node-a", models=[_model()])))
    assert decision == peerplan.Peer((("node-a", "https://10.0.0.1:8476"),), D1)
    assert isinstance(decision, peerplan.Peer)
    assert decision.source == "peer/node-a"


def test_a_node_of_another_scope_is_never_a_source() -> None:
    other = _node("node-a", models=[_model(scopes=(OTHER_SCOPE,))], state="ModelDownloaded")
    assert peerplan.plan(_req(other)) == peerplan.Origin("no-source")


def test_this_node_is_never_its_own_source() -> None:
    me = _node(ME, models=[_model()])
    request = _req(members=[me], waited_s=peerplan.SETTLE_S)
    assert peerplan.plan(request) == peerplan.Origin("no-source")


def test_sources_rank_by_fewest_children_then_name_and_keep_at_most_three() -> None:
    servers = [_node(f"node-{c}", models=[_model()], endpoint=f"https://{c}:1") for c in "abcde"]
    load = [_fetching_from("node-a", 1, "kid-1"), _fetching_from("node-c", 1, "kid-2")]
    decision = peerplan.plan(_req(*servers, *load))
    assert isinstance(decision, peerplan.Peer)
    assert [n for n, _ in decision.sources] == ["node-b", "node-d", "node-e"]
    assert len(decision.sources) == peer.MAX_SOURCES


def test_a_node_at_max_uploads_is_skipped() -> None:
    busy = _node("node-a", models=[_model()])
    free = _node("node-z", models=[_model()], endpoint="https://z:1")
    decision = peerplan.plan(_req(busy, free, _fetching_from("node-a", 2, "kid")))
    assert isinstance(decision, peerplan.Peer)
    assert decision.sources == (("node-z", "https://z:1"),)


def test_children_not_in_flight_do_not_count() -> None:
    done = _node(
        "kid", endpoint=None, lists=False, states={"m": "ModelDownloaded"},
        progress={"m": {"source": "peer/node-a"}},
    )  # fmt: skip
    assert peerplan.children([done]) == {}
    decision = peerplan.plan(_req(_node("node-a", models=[_model()]), done, done))
    assert isinstance(decision, peerplan.Peer)


def test_every_source_at_the_cap_means_waiting_for_the_seed() -> None:
    busy = _node("node-a", models=[_model()], state="ModelDownloaded")
    decision = peerplan.plan(_req(busy, _fetching_from("node-a", 2, "kid")))
    assert isinstance(decision, peerplan.WaitForSeed)
    assert decision.node == "node-a"


def test_only_sources_with_the_best_ones_digest_are_kept() -> None:
    a = _node("node-a", models=[_model(D1)], endpoint="https://a:1")
    b = _node("node-b", models=[_model(D2)], endpoint="https://b:1")
    c = _node("node-c", models=[_model(D1)], endpoint="https://c:1")
    decision = peerplan.plan(_req(a, b, c))
    assert decision == peerplan.Peer((("node-a", "https://a:1"), ("node-c", "https://c:1")), D1)


def test_unusable_endpoints_are_no_source() -> None:
    for endpoint in ("http://a:1", "https://a:1 --evil", "https://" + "a" * 200, "https://a=b"):
        node = _node("node-a", models=[_model()], endpoint=endpoint, lists=False)
        assert peerplan.plan(_req(node, waited_s=peerplan.SETTLE_S)) == peerplan.Origin(
            "no-source"
        ), endpoint


def test_after_a_failed_peer_attempt_the_origin_is_used() -> None:
    decision = peerplan.plan(_req(_node("node-a", models=[_model()]), previous_peer_failed=True))
    assert decision == peerplan.Origin("peer-failed")


def test_a_node_downloading_from_the_origin_in_the_scope_is_waited_for() -> None:
    downloading = _node(
        "node-z",
        endpoint="https://z:1",
        lists=False,
        states={"other": "ModelDownloading"},
        progress={"other": {"source": "origin", "jobName": "j1"}},
        jobs=[{"namespace": "ns", "name": "j1", "uid": "u", "statusKey": "other",
               "storageKey": KEY, "scope": SCOPE, "attempt": 0}],
    )  # fmt: skip
    decision = peerplan.plan(_req(downloading))
    assert isinstance(decision, peerplan.WaitForSeed)
    assert decision.node == "node-z"
    assert "node-z" in decision.message


def test_a_node_downloading_in_another_scope_is_not_waited_for() -> None:
    downloading = _node(
        "node-z", lists=False, states={"other": "ModelDownloading"},
        progress={"other": {"source": "origin", "jobName": "j1"}},
        jobs=[{"namespace": "ns", "name": "j1", "uid": "u", "statusKey": "other",
               "storageKey": KEY, "scope": OTHER_SCOPE, "attempt": 0}],
    )  # fmt: skip
    assert peerplan.plan(_req(downloading, waited_s=peerplan.SETTLE_S)) == peerplan.Origin(
        "no-source"
    )


def test_the_lowest_named_node_listing_the_entry_is_the_seed() -> None:
    assert peerplan.plan(_req(_node("node-z", endpoint=None))) == peerplan.Origin("no-source")
    decision = peerplan.plan(_req(_node("node-a", endpoint=None), _node("node-b")))
    assert isinstance(decision, peerplan.WaitForSeed)
    assert decision.node == "node-a"


def test_a_failed_seed_is_passed_over() -> None:
    failed = _node("node-a", state="ModelDownloadError")
    decision = peerplan.plan(_req(failed, _node("node-b", state="ModelDownloadError")))
    assert decision == peerplan.Origin("no-source")  # this node is the seed now
    decision = peerplan.plan(_req(failed, _node("node-b")))
    assert isinstance(decision, peerplan.WaitForSeed)
    assert decision.node == "node-b"


def test_a_downloaded_seed_that_cannot_serve_this_scope_is_passed_over() -> None:
    other_scope = _node("node-a", models=[_model(scopes=(OTHER_SCOPE,))], state="ModelDownloaded")
    not_serving = _node("node-b", endpoint=None, state="ModelDownloaded")
    assert peerplan.plan(_req(other_scope, not_serving)) == peerplan.Origin("no-source")


def test_a_downloaded_seed_still_hashing_is_waited_for() -> None:
    hashing = _node("node-a", models=[], state="ModelDownloaded")
    assert isinstance(peerplan.plan(_req(hashing)), peerplan.WaitForSeed)


def test_a_downloaded_seed_that_says_it_cannot_serve_the_model_is_passed_over() -> None:
    """It found a FIFO in the folder (say): waiting for it would last `seed_wait_s`."""
    said = [{"storageKey": KEY, "reason": "unservable"}]
    refusing = _node("node-a", models=[], state="ModelDownloaded", unservable=said)
    assert peerplan.plan(_req(refusing)) == peerplan.Origin("no-source")
    other_key = [{"storageKey": "f" * 16, "reason": "unservable"}]
    hashing = _node("node-a", models=[], state="ModelDownloaded", unservable=other_key)
    assert isinstance(peerplan.plan(_req(hashing)), peerplan.WaitForSeed)


def _clock(
    seed: str, elected_s: float, idle_s: float = 0.0, last: peerplan.SeedProgress | None = None
) -> peerplan.SeedClock:
    return peerplan.SeedClock(seed, elected_s, idle_s, last, last.bytes if last else 0)


def test_an_elected_seed_that_never_starts_is_waited_for_only_seed_start_s() -> None:
    """Its agent is down (or it cannot launch): its entry never leaves Pending."""
    idle = _node("node-a", state="ModelDownloadPending")
    waiting = peerplan.plan(_req(idle, seed_clock=_clock("node-a", 59), seed_start_s=60))
    assert isinstance(waiting, peerplan.WaitForSeed)
    decision = peerplan.plan(_req(idle, seed_clock=_clock("node-a", 60), seed_start_s=60))
    assert decision == peerplan.Origin("seed-not-started")
    silent = _node("node-a")  # no status at all
    decision = peerplan.plan(_req(silent, seed_clock=_clock("node-a", 60), seed_start_s=60))
    assert decision == peerplan.Origin("seed-not-started")
    for begun in ("ModelDownloading", "ModelDownloaded"):
        started = _node("node-a", models=[], state=begun)
        decision = peerplan.plan(_req(started, seed_clock=_clock("node-a", 60), seed_start_s=60))
        assert isinstance(decision, peerplan.WaitForSeed)
    # a seed elected after another failed gets its own `seed_start_s`
    failed = _node("node-a", state="ModelDownloadError")
    newly = _node("node-b", state="ModelDownloadPending")
    decision = peerplan.plan(_req(failed, newly, waited_s=90, seed_clock=_clock("node-a", 90, 90)))
    assert isinstance(decision, peerplan.WaitForSeed)
    assert decision.node == "node-b"


def _downloading_seed(size: int, job: str = "j", state: str = "ModelDownloading") -> Any:
    return _node("node-a", state=state, progress={"iris": {"bytesOnDisk": size, "jobName": job}})


def test_the_wait_for_a_seed_ends_when_its_entry_stops_moving() -> None:
    """As long as the seed's download moves, the unit waits; `seed_wait_s` without a move
    ends it, and so does `seed_max_wait_s` in any case. A move seen in this LIST counts
    even when the unit last looked long ago. The count is the awaited seed's."""
    at_10 = peerplan.SeedProgress("ModelDownloading", "j", 10)
    seed = _downloading_seed(10)
    moving = _req(seed, waited_s=3600, seed_clock=_clock("node-a", 3600, 299, at_10))
    assert isinstance(peerplan.plan(moving), peerplan.WaitForSeed)
    still = _req(seed, seed_clock=_clock("node-a", 300, 300, at_10), seed_wait_s=300)
    assert peerplan.plan(still) == peerplan.Origin("seed-wait-timeout")
    grew = _req(_downloading_seed(500), seed_clock=_clock("node-a", 301, 301, at_10))
    assert isinstance(peerplan.plan(grew), peerplan.WaitForSeed)
    other = _req(seed, seed_clock=_clock("node-z", 300, 300, at_10), seed_wait_s=300)
    assert isinstance(peerplan.plan(other), peerplan.WaitForSeed)
    too_long = _req(seed, waited_s=peerplan.SEED_MAX_WAIT_S, seed_clock=_clock("node-a", 1, 1))
    assert peerplan.plan(too_long) == peerplan.Origin("seed-wait-timeout")


def test_a_downloaded_seed_is_waited_for_while_it_could_still_be_hashing() -> None:
    """A large model is Downloaded, then hashed before it is served: nothing of the seed's
    entry moves meanwhile, so the wait allows its bytes at `HASH_FLOOR_BPS` beyond
    `seed_wait_s` (before, a 100 GiB http model sent every follower to the origin)."""
    size = 100 << 30
    hashing_for = size / peerplan.HASH_FLOOR_BPS
    done = peerplan.SeedProgress("ModelDownloaded", "j", size)
    seed = _node(
        "node-a",
        models=[],
        state="ModelDownloaded",
        progress={"iris": {"bytesOnDisk": size, "jobName": "j"}},
    )

    def after(idle: float) -> peerplan.Decision:
        return peerplan.plan(
            _req(seed, seed_clock=_clock("node-a", idle, idle, done), seed_wait_s=300)
        )

    assert isinstance(after(300 + hashing_for - 1), peerplan.WaitForSeed)
    assert after(300 + hashing_for) == peerplan.Origin("seed-wait-timeout")
    # a seed still downloading gets no such allowance
    downloading = peerplan.SeedProgress("ModelDownloading", "j", size)
    assert downloading.idle_limit(300) == 300
    assert done.idle_limit(300) == 300 + hashing_for
    # its size is its files' apparent size: a sparse file adds at most HASH_MAX_S
    huge = peerplan.SeedProgress("ModelDownloaded", "j", 1 << 60)
    assert huge.idle_limit(300) == 300 + peerplan.HASH_MAX_S


def test_a_seed_moves_with_another_job_more_bytes_or_downloaded_never_by_flapping() -> None:
    before = peerplan.SeedProgress("ModelDownloading", "j", 10)
    assert before.moved_from(None, 0)
    assert peerplan.SeedProgress("ModelDownloading", "j", 11).moved_from(before, 10)
    assert peerplan.SeedProgress("ModelDownloadPending", "k", 0).moved_from(before, 10)
    assert peerplan.SeedProgress("ModelDownloaded", "j", 10).moved_from(before, 10)
    assert not peerplan.SeedProgress("ModelDownloading", "j", 10).moved_from(before, 10)
    assert not peerplan.SeedProgress("ModelDownloading", "j", 20).moved_from(before, 30)
    assert not peerplan.SeedProgress("ModelDownloadPending", "j", 10).moved_from(before, 10)


def test_the_seed_progress_is_read_from_the_entry_downloading_it() -> None:
    """A namespace entry of the seed downloads it (its downloadJobs record names the key)."""
    seed = _node(
        "node-a",
        states={"team/iris": "ModelDownloading"},
        progress={"team/iris": {"bytesOnDisk": 7, "jobName": "j1", "source": "origin"}},
        jobs=[
            {
                "name": "j1",
                "namespace": "jobs",
                "uid": "u1",
                "attempt": 0,
                "statusKey": "team/iris",
                "storageKey": KEY,
                "scope": SCOPE,
            }
        ],
    )
    decision = peerplan.plan(_req(seed))
    assert isinstance(decision, peerplan.WaitForSeed)
    assert decision.progress == peerplan.SeedProgress("ModelDownloading", "j1", 7)


def test_a_node_that_sees_no_other_listing_the_entry_settles_before_the_origin() -> None:
    """The group's specs are written concurrently: alone in the LIST, a node waits
    `SETTLE_S` before it elects itself (two nodes did, each before the other's spec)."""
    settling = peerplan.plan(_req())
    assert settling == peerplan.WaitForSeed(ME, peerplan.SETTLE_MESSAGE)
    assert peerplan.plan(_req(waited_s=peerplan.SETTLE_S)) == peerplan.Origin("no-source")
    # another node listing the entry: no settling, the election decides at once
    decision = peerplan.plan(_req(_node("node-z", endpoint=None)))
    assert decision == peerplan.Origin("no-source")


def test_nodes_not_listing_the_entry_are_no_seed() -> None:
    assert peerplan.plan(
        _req(_node("node-a", lists=False), waited_s=peerplan.SETTLE_S)
    ) == peerplan.Origin("no-source")


def test_namespace_entries_elect_by_their_status_key() -> None:
    node = modelnode.LocalModelNode.model_validate(
        {
            "metadata": {"name": "node-a"},
            "spec": {"localModels": [{"sourceModelUri": "s3://b/iris", "modelName": "iris",
                                      "nodeGroup": "g", "namespace": "team"}]},
        }
    )  # fmt: skip
    assert isinstance(peerplan.plan(_req(node, status_key="team/iris")), peerplan.WaitForSeed)
    assert peerplan.plan(_req(node, waited_s=peerplan.SETTLE_S)) == peerplan.Origin("no-source")


def _downloading(scopes: tuple[str, ...] = (SCOPE,)) -> dict[str, Any]:
    return {"storageKey": KEY, "complete": False, "scopes": list(scopes), "bytes": 0}


def test_a_node_still_downloading_in_the_scope_is_followed() -> None:
    seed = _node("node-a", models=[_downloading()], state="ModelDownloading")
    decision = peerplan.plan(_req(seed))
    assert decision == peerplan.Peer((("node-a", "https://10.0.0.1:8476"),), peer.FOLLOW)


def test_a_complete_source_beats_nodes_still_downloading() -> None:
    seed = _node("node-a", models=[_downloading()], endpoint="https://a:1")
    done = _node("node-z", models=[_model()], endpoint="https://z:1")
    decision = peerplan.plan(_req(seed, done))
    assert decision == peerplan.Peer((("node-z", "https://z:1"),), D1)


def test_a_download_of_another_scope_is_never_followed() -> None:
    other = _node("node-a", models=[_downloading((OTHER_SCOPE,))], endpoint="https://a:1")
    assert not isinstance(peerplan.plan(_req(other)), peerplan.Peer)


def test_a_node_following_this_one_is_never_followed_back() -> None:
    child = _node(
        "node-a",
        models=[_downloading()],
        state="ModelDownloading",
        progress={"iris": {"source": f"peer/{ME}"}},
    )
    other = _node("node-b", models=[_downloading()], endpoint="https://b:1")
    decision = peerplan.plan(_req(child, other))
    assert decision == peerplan.Peer((("node-b", "https://b:1"),), peer.FOLLOW)


def test_a_node_still_downloading_at_max_uploads_is_skipped_and_its_children_followed() -> None:
    seed = _node("node-a", models=[_downloading()], endpoint="https://a:1")
    kids = [
        _node(
            f"kid-{i}",
            models=[_downloading()],
            endpoint=f"https://k{i}:1",
            state="ModelDownloading",
            progress={"iris": {"source": "peer/node-a"}},
        )
        for i in (1, 2)
    ]
    decision = peerplan.plan(_req(seed, *kids))
    assert isinstance(decision, peerplan.Peer)
    assert decision.digest == peer.FOLLOW
    assert [n for n, _ in decision.sources] == ["kid-1", "kid-2"]


def test_a_provable_unit_proves_to_a_node_holding_the_model_for_another_scope() -> None:
    other = _node("node-a", models=[_model(scopes=(OTHER_SCOPE,))], state="ModelDownloaded")
    decision = peerplan.plan(_req(other, provable=True))
    assert decision == peerplan.Peer((("node-a", "https://10.0.0.1:8476"),), D1, prove=True)


def test_a_source_of_the_own_scope_needs_no_proof() -> None:
    own = _node("node-b", models=[_model(D2)], state="ModelDownloaded")
    other = _node("node-a", models=[_model(scopes=(OTHER_SCOPE,))], state="ModelDownloaded")
    decision = peerplan.plan(_req(other, own, provable=True))
    assert decision == peerplan.Peer((("node-b", "https://10.0.0.1:8476"),), D2)


def test_a_complete_copy_of_another_scope_beats_following_the_own_download() -> None:
    other = _node("node-a", models=[_model(scopes=(OTHER_SCOPE,))], state="ModelDownloaded")
    partial = {"storageKey": KEY, "complete": False, "scopes": [SCOPE], "bytes": 0}
    following = _node("node-b", models=[partial])
    decision = peerplan.plan(_req(other, following, provable=True))
    assert decision == peerplan.Peer((("node-a", "https://10.0.0.1:8476"),), D1, prove=True)
    assert peerplan.plan(_req(other, following)) == peerplan.Peer(
        (("node-b", "https://10.0.0.1:8476"),), peer.FOLLOW
    )


def test_a_download_in_progress_of_another_scope_is_never_proved_to() -> None:
    partial = {"storageKey": KEY, "complete": False, "scopes": [OTHER_SCOPE], "bytes": 0}
    decision = peerplan.plan(_req(_node("node-a", models=[partial]), provable=True))
    assert not isinstance(decision, peerplan.Peer)


def test_a_node_of_another_scope_at_max_uploads_is_no_proof_source() -> None:
    other = _node("node-a", models=[_model(scopes=(OTHER_SCOPE,))], state="ModelDownloaded")
    spec = peer.PeerDistributionSpec(enabled=True, max_uploads=1)
    decision = peerplan.plan(
        _req(other, _fetching_from("node-a", 1, "node-x"), provable=True, spec=spec)
    )
    assert not isinstance(decision, peerplan.Peer)
