"""Lease configuration: client-go's defaults, its validation rules and the per-call timeout.
(The election itself runs against the real apiserver in tests/integration/runtime.)"""

from __future__ import annotations

import pytest

from localcache.runtime import leaderelection


def test_defaults_are_client_go_s() -> None:
    config = leaderelection.LeaderElectionConfig(namespace="ns", name="lock")
    assert (config.lease_duration, config.renew_deadline, config.retry_period) == (15, 10, 2)
    assert config.request_timeout == 5.0
    assert "_" in config.identity


@pytest.mark.parametrize(
    ("lease", "renew", "retry", "message"),
    [
        pytest.param(10, 10, 2, "lease_duration", id="lease-not-longer-than-renew"),
        pytest.param(15, 2, 2, "renew_deadline", id="renew-within-jittered-retry"),
        pytest.param(15, 10, 0, "retry_period", id="zero-retry"),
    ],
)
def test_inconsistent_timings_are_refused(
    lease: float, renew: float, retry: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        leaderelection.LeaderElectionConfig(
            namespace="ns",
            name="lock",
            lease_duration=lease,
            renew_deadline=renew,
            retry_period=retry,
        )


def test_each_call_times_out_within_half_the_renew_deadline() -> None:
    short = leaderelection.LeaderElectionConfig(
        namespace="ns", name="lock", lease_duration=4, renew_deadline=3, retry_period=0.5
    )
    assert short.request_timeout == 1.5
