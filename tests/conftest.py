"""Shared pytest configuration: the control-plane fixtures live in tests.support.plugin."""

pytest_plugins = ["tests.support.plugin"]
