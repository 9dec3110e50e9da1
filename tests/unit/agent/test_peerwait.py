"""The planner's clocks per unit (`agent.peerwait`): since the unit began waiting, since its
seed was elected, since that seed's entry last changed."""

from __future__ import annotations

from localcache.agent import peerplan, peerwait

KEY = ("0123456789abcdef", "a" * 64, "gpu")


def _wait(node: str, progress: str) -> peerplan.WaitForSeed:
    return peerplan.WaitForSeed(node, "waiting", progress)


def test_a_unit_never_waiting_has_no_clock() -> None:
    assert peerwait.SeedWaits().request_fields(KEY, 100.0) == (0.0, ("", 0.0, 0.0))


def test_progress_of_the_seed_restarts_only_the_change_clock() -> None:
    waits = peerwait.SeedWaits()
    assert waits.waiting(KEY, _wait("node-a", "Downloading/0/j"), 100.0) == 100.0
    assert waits.request_fields(KEY, 150.0) == (50.0, ("node-a", 50.0, 50.0))
    waits.waiting(KEY, _wait("node-a", "Downloading/0/j"), 150.0)  # no change
    waits.waiting(KEY, _wait("node-a", "Downloading/10/j"), 160.0)
    assert waits.request_fields(KEY, 170.0) == (70.0, ("node-a", 70.0, 10.0))


def test_another_seed_restarts_its_clocks_but_not_the_units() -> None:
    waits = peerwait.SeedWaits()
    waits.waiting(KEY, _wait("node-a", "x"), 100.0)
    waits.waiting(KEY, _wait("node-b", "x"), 180.0)
    assert waits.request_fields(KEY, 200.0) == (100.0, ("node-b", 20.0, 20.0))


def test_done_and_prune_forget_the_unit() -> None:
    waits = peerwait.SeedWaits()
    waits.waiting(KEY, _wait("node-a", "x"), 100.0)
    waits.done(KEY)
    assert waits.request_fields(KEY, 110.0) == (0.0, ("", 0.0, 0.0))
    other = ("f" * 16, "b" * 64, "gpu")
    waits.waiting(KEY, _wait("node-a", "x"), 100.0)
    waits.waiting(other, _wait("node-a", "x"), 100.0)
    waits.request_fields(other, 500.0)  # still looked at
    waits.prune(700.0, 300.0)
    assert waits.request_fields(KEY, 700.0) == (0.0, ("", 0.0, 0.0))
    assert waits.request_fields(other, 700.0)[0] == 600.0
