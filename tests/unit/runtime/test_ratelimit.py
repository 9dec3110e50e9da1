"""Rate limiters give client-go's exact delays, on a fake clock.

Matrix: per-item exponential (5 ms doubling, 1000 s cap, per key, forget resets, huge failure
counts do not overflow); token bucket (burst of 100 free, then 10 qps, refills with time,
never above the burst); max-of (largest delay, every limiter consulted, forget fans out); the
default controller limiter combines the two.
"""

from __future__ import annotations

import pytest

from localcache.runtime import clock, keys, ratelimit

A = keys.ObjectKey("ns", "a")
B = keys.ObjectKey("ns", "b")


def test_item_exponential_doubles_from_5ms_and_caps_at_1000s() -> None:
    limiter = ratelimit.ItemExponentialFailureRateLimiter()
    delays = [limiter.when(A) for _ in range(22)]
    expected = [min(0.005 * 2**n, 1000.0) for n in range(22)]
    assert delays == pytest.approx(expected)
    assert delays[:4] == pytest.approx([0.005, 0.01, 0.02, 0.04])
    assert delays[17] == pytest.approx(655.36)
    assert delays[18:] == [1000.0] * 4
    assert limiter.num_requeues(A) == 22


def test_item_exponential_tracks_each_key_separately() -> None:
    limiter = ratelimit.ItemExponentialFailureRateLimiter()
    limiter.when(A)
    limiter.when(A)
    assert limiter.when(B) == pytest.approx(0.005)
    assert (limiter.num_requeues(A), limiter.num_requeues(B)) == (2, 1)


def test_item_exponential_forget_starts_the_key_over() -> None:
    limiter = ratelimit.ItemExponentialFailureRateLimiter()
    for _ in range(5):
        limiter.when(A)
    limiter.forget(A)
    assert limiter.num_requeues(A) == 0
    assert limiter.when(A) == pytest.approx(0.005)


def test_item_exponential_does_not_overflow_after_many_failures() -> None:
    limiter = ratelimit.ItemExponentialFailureRateLimiter()
    for _ in range(3000):
        delay = limiter.when(A)
    assert delay == 1000.0


def test_item_exponential_rejects_nonsense_bounds() -> None:
    with pytest.raises(ValueError, match="base_delay"):
        ratelimit.ItemExponentialFailureRateLimiter(base_delay=2.0, max_delay=1.0)


def test_bucket_allows_a_burst_of_100_then_10_per_second() -> None:
    limiter = ratelimit.BucketRateLimiter(clock=clock.FakeClock())
    burst = [limiter.when(A) for _ in range(100)]
    assert burst == [0.0] * 100
    assert [limiter.when(A) for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])


def test_bucket_is_shared_by_all_keys_and_ignores_forget() -> None:
    limiter = ratelimit.BucketRateLimiter(1.0, 1, clock=clock.FakeClock())
    assert limiter.when(A) == 0.0
    limiter.forget(A)
    assert limiter.when(B) == pytest.approx(1.0)
    assert limiter.num_requeues(B) == 0


async def test_bucket_refills_with_time_up_to_the_burst() -> None:
    fake = clock.FakeClock()
    limiter = ratelimit.BucketRateLimiter(10.0, 100, clock=fake)
    for _ in range(100):
        limiter.when(A)
    await fake.advance(1.0)  # ten tokens back
    assert [limiter.when(A) for _ in range(10)] == [0.0] * 10
    assert limiter.when(A) == pytest.approx(0.1)
    await fake.advance(3600.0)  # an hour idle refills to the burst, not beyond
    assert [limiter.when(A) for _ in range(100)] == [0.0] * 100
    assert limiter.when(A) == pytest.approx(0.1)


def test_max_of_returns_the_largest_delay_and_consults_every_limiter() -> None:
    fake = clock.FakeClock()
    item = ratelimit.ItemExponentialFailureRateLimiter()
    bucket = ratelimit.BucketRateLimiter(10.0, 2, clock=fake)
    limiter = ratelimit.MaxOfRateLimiter(item, bucket)
    assert limiter.when(A) == pytest.approx(0.005)  # bucket free, item 5 ms
    assert limiter.when(A) == pytest.approx(0.01)  # bucket free, item 10 ms
    assert limiter.when(B) == pytest.approx(0.1)  # bucket empty: 100 ms beats 5 ms
    assert limiter.num_requeues(A) == 2
    limiter.forget(A)
    assert item.num_requeues(A) == 0


def test_max_of_needs_a_limiter() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ratelimit.MaxOfRateLimiter()


def test_default_controller_limiter_is_per_item_backoff_with_a_shared_bucket() -> None:
    limiter = ratelimit.default_controller_rate_limiter(clock.FakeClock())
    assert [limiter.when(A) for _ in range(3)] == pytest.approx([0.005, 0.01, 0.02])
    for n in range(97):
        limiter.when(keys.ObjectKey("ns", f"k{n}"))
    # 100 tokens used: the bucket's 100 ms now beats B's first 5 ms.
    assert limiter.when(B) == pytest.approx(0.1)
