"""Test fixtures every layer imports: the real control plane, waiting, task-leak guard.

Load them into pytest with `pytest_plugins = ["localcache.runtime.testing.plugin"]`.
"""
