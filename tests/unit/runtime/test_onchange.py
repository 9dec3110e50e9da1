"""`OnChange`: a problem is reported when its state changes, not on every pass; bounded, and
forgotten when its key goes."""

from __future__ import annotations

import pytest

from localcache.runtime import onchange


def test_a_state_is_reported_once_until_it_changes() -> None:
    warned = onchange.OnChange()
    assert warned.changed("model-a", "no credentials")
    assert not warned.changed("model-a", "no credentials")
    assert not warned.changed("model-a", "no credentials")
    assert warned.changed("model-a", "PV path differs")
    assert warned.changed("model-a", "no credentials"), "a change back is a change too"


def test_keys_are_independent() -> None:
    warned = onchange.OnChange()
    assert warned.changed("model-a", "x")
    assert warned.changed("model-b", "x")
    assert not warned.changed("model-a", "x")


def test_a_forgotten_key_is_reported_again() -> None:
    warned = onchange.OnChange()
    warned.changed("model-a", "x")
    warned.forget("model-a")
    warned.forget("never-seen")
    assert warned.changed("model-a", "x")


def test_retain_forgets_keys_that_left() -> None:
    warned = onchange.OnChange()
    for key in ("a", "b", "c"):
        warned.changed(key, "x")
    warned.retain(["b", "z"])
    assert len(warned) == 1
    assert not warned.changed("b", "x")
    assert warned.changed("a", "x")


def test_memory_is_bounded_forgetting_the_oldest_report_first() -> None:
    warned = onchange.OnChange(max_keys=2)
    warned.changed("a", "x")
    warned.changed("b", "x")
    warned.changed("a", "y")  # a is now the most recent
    warned.changed("c", "x")  # evicts b
    assert len(warned) == 2
    assert not warned.changed("a", "y")
    assert not warned.changed("c", "x")
    assert warned.changed("b", "x")


def test_max_keys_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_keys"):
        onchange.OnChange(max_keys=0)
