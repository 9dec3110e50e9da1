"""Shared pytest configuration: the control-plane fixtures live in localcache.runtime.testing."""

pytest_plugins = ["localcache.runtime.testing.plugin"]
