"""Lease timings: client-go's defaults, settable by flag or environment, and refused (naming
the flags) unless lease duration > renew deadline > 1.2 * retry period."""

from __future__ import annotations

import pytest

from localcache import settings
from tests.unit.app.test_settings import _parse


def test_lease_timings_default_to_client_go_s_and_are_settable() -> None:
    s = _parse("controller", [], {}).leadership
    assert (s.lease_duration, s.renew_deadline, s.retry_period) == (15.0, 10.0, 2.0)
    s = _parse(
        "controller",
        ["--leader-elect-lease-duration", "8", "--leader-elect-renew-deadline", "6"],
        {"LOCALCACHE_RETRY_PERIOD": "1"},
    ).leadership
    assert (s.lease_duration, s.renew_deadline, s.retry_period) == (8.0, 6.0, 1.0)


@pytest.mark.parametrize(
    "argv",
    [
        ["--leader-elect-lease-duration", "10"],  # not longer than the renew deadline
        ["--leader-elect-renew-deadline", "2"],  # within a jittered retry period
        ["--leader-elect-retry-period", "0"],
    ],
)
def test_inconsistent_lease_timings_are_refused(argv: list[str]) -> None:
    with pytest.raises(settings.SettingsError, match="--leader-elect"):
        _parse("controller", argv, {})
