"""The planner's clocks per unit (`agent.peerwait`): since the unit began waiting, since its
seed was first awaited, since that seed's entry last moved."""

from __future__ import annotations

from localcache.agent import peerplan, peerwait

KEY = ("0123456789abcdef", "a" * 64, "gpu")
Progress = peerplan.SeedProgress


def _wait(node: str, size: int, job: str = "j") -> peerplan.WaitForSeed:
    return peerplan.WaitForSeed(node, "waiting", Progress("ModelDownloading", job, size))


def test_a_unit_never_waiting_has_no_clock() -> None:
    assert peerwait.SeedWaits().request_fields(KEY, 100.0) == (0.0, peerplan.SeedClock())


def test_a_move_of_the_seed_restarts_only_the_idle_clock() -> None:
    waits = peerwait.SeedWaits()
    assert waits.waiting(KEY, _wait("node-a", 0), 100.0) == 100.0
    waited, clock = waits.request_fields(KEY, 150.0)
    assert (waited, clock.seed, clock.elected_s, clock.idle_s) == (50.0, "node-a", 50.0, 50.0)
    waits.waiting(KEY, _wait("node-a", 0), 150.0)  # no move
    waits.waiting(KEY, _wait("node-a", 10), 160.0)
    waited, clock = waits.request_fields(KEY, 170.0)
    assert (waited, clock.elected_s, clock.idle_s) == (70.0, 70.0, 10.0)
    assert clock.last == Progress("ModelDownloading", "j", 10)
    assert clock.most == 10


def test_bytes_flapping_below_the_most_seen_are_no_move() -> None:
    """A seed whose bytes go back and forth (a Job rewriting a file) cannot hold its
    followers for ever: only more bytes than ever seen of its Job, or another Job."""
    waits = peerwait.SeedWaits()
    waits.waiting(KEY, _wait("node-a", 20), 100.0)
    for at, size in ((200.0, 10), (300.0, 20), (400.0, 10)):
        waits.waiting(KEY, _wait("node-a", size), at)
    assert waits.request_fields(KEY, 400.0)[1].idle_s == 300.0
    waits.waiting(KEY, _wait("node-a", 5, job="retry"), 450.0)  # another Job: a move
    _, clock = waits.request_fields(KEY, 450.0)
    assert (clock.idle_s, clock.most) == (0.0, 5)


def test_another_seed_restarts_its_clocks_but_not_the_units() -> None:
    waits = peerwait.SeedWaits()
    waits.waiting(KEY, _wait("node-a", 0), 100.0)
    waits.waiting(KEY, _wait("node-b", 0), 180.0)
    waited, clock = waits.request_fields(KEY, 200.0)
    assert (waited, clock.seed, clock.elected_s, clock.idle_s) == (100.0, "node-b", 20.0, 20.0)


def test_done_and_prune_forget_the_unit() -> None:
    waits = peerwait.SeedWaits()
    waits.waiting(KEY, _wait("node-a", 0), 100.0)
    waits.done(KEY)
    assert waits.request_fields(KEY, 110.0) == (0.0, peerplan.SeedClock())
    other = ("f" * 16, "b" * 64, "gpu")
    waits.waiting(KEY, _wait("node-a", 0), 100.0)
    waits.waiting(other, _wait("node-a", 0), 100.0)
    waits.request_fields(other, 500.0)  # still looked at
    waits.prune(700.0, 300.0)
    assert waits.request_fields(KEY, 700.0) == (0.0, peerplan.SeedClock())
    assert waits.request_fields(other, 700.0)[0] == 600.0
