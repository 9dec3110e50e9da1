"""Logging set-up: secrets never reach a log line; context and level are honoured.

Matrix: secret-looking keys are redacted at the top level and nested in dicts and lists;
keys that only name a secret and the object `key` are kept; Secret objects lose data and
stringData; bearer strings are redacted wherever they appear; configure() renders JSON with
the bound reconcile context and filters by level; reconcile_context() restores what was bound
before it; unknown levels are refused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from localcache.runtime import keys
from localcache.runtime import logging as log_setup

R = log_setup.REDACTED


def _redact(**event: Any) -> dict[str, Any]:
    return dict(log_setup.redact_secrets(None, "info", {"event": "e", **event}))


@pytest.mark.parametrize(
    "name",
    [
        "token",
        "bearer_token",
        "password",
        "client_secret",
        "AWS_SECRET_ACCESS_KEY",
        "access_key_id",
        "client-key-data",
        "authorization",
        "credentials",
        "api_key",
        "tls.key",
    ],
)
def test_secret_looking_keys_are_redacted(name: str) -> None:
    assert _redact(**{name: "hunter2"})[name] == R


@pytest.mark.parametrize(
    "name", ["key", "secret_name", "secretKeyRef", "token_path", "controller", "storage_key"]
)
def test_keys_that_only_name_a_secret_are_kept(name: str) -> None:
    assert _redact(**{name: "visible"})[name] == "visible"


def test_nested_secrets_are_redacted_in_dicts_and_lists() -> None:
    out = _redact(
        config={"endpoint": "s3.example", "auth": {"password": "p", "user": "u"}},
        env=[{"name": "A", "token": "t"}, "Bearer eyJhbGciOi.J9abc"],
    )
    assert out["config"] == {"endpoint": "s3.example", "auth": {"password": R, "user": "u"}}
    assert out["env"] == [{"name": "A", "token": R}, R]


def test_secret_objects_lose_their_data() -> None:
    secret = {
        "kind": "Secret",
        "metadata": {"name": "s3-creds"},
        "data": {"AWS_ACCESS_KEY_ID": "QUtJQQ=="},
        "stringData": {"x": "y"},
    }
    out = _redact(obj=secret)
    assert out["obj"]["data"] == R
    assert out["obj"]["stringData"] == R
    assert out["obj"]["metadata"] == {"name": "s3-creds"}
    assert secret["data"] == {"AWS_ACCESS_KEY_ID": "QUtJQQ=="}, "the caller's dict was mutated"


def test_bearer_strings_are_redacted_under_any_key() -> None:
    assert _redact(header="Bearer eyJhbGciOi")["header"] == R
    assert _redact(note="bearer is a word")["note"] == "bearer is a word"


@pytest.fixture
def configured() -> Iterator[None]:
    """Undo configure(): structlog defaults, and the root logger's handlers and level."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("configured")
def test_configure_renders_json_with_reconcile_context_and_no_secrets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log_setup.configure(level="info", renderer="json")
    logger = structlog.get_logger("test")
    with log_setup.reconcile_context(
        controller="widget", key=keys.ObjectKey("ns", "a"), reconcile_id="r-1"
    ):
        logger.info("reconcile_started", token="s3cr3t")
    logger.debug("too_quiet")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, "the debug line passed an info level filter"
    line = json.loads(lines[0])
    assert line["event"] == "reconcile_started"
    assert (line["controller"], line["key"], line["reconcile_id"]) == ("widget", "ns/a", "r-1")
    assert line["token"] == R
    assert line["level"] == "info"
    assert "s3cr3t" not in lines[0]


@pytest.mark.usefixtures("configured")
def test_console_renderer_is_available(capsys: pytest.CaptureFixture[str]) -> None:
    log_setup.configure(level="debug", renderer="console")
    structlog.get_logger("test").debug("hello_console", password="x")
    err = capsys.readouterr().err
    assert "hello_console" in err
    assert "password=x" not in err


@pytest.mark.usefixtures("configured")
def test_standard_library_records_are_rendered_and_redacted_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log_setup.configure(level="warning", renderer="json")
    log_setup.configure(level="warning", renderer="json")  # idempotent: one handler
    library = logging.getLogger("some.library")
    library.warning("connection to %s failed", "apiserver", extra={"password": "pw"})
    library.info("too quiet")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert line["event"] == "connection to apiserver failed"
    assert (line["logger"], line["level"]) == ("some.library", "warning")
    assert line["password"] == R


def test_unknown_log_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        log_setup.configure(level="chatty")


def test_reconcile_context_restores_what_was_bound_before() -> None:
    structlog.contextvars.bind_contextvars(key="outer")
    try:
        with log_setup.reconcile_context(
            controller="widget", key=keys.ObjectKey("ns", "a"), reconcile_id="r-1"
        ):
            bound = structlog.contextvars.get_contextvars()
            assert (bound["controller"], bound["key"], bound["reconcile_id"]) == (
                "widget",
                "ns/a",
                "r-1",
            )
        assert structlog.contextvars.get_contextvars() == {"key": "outer"}
    finally:
        structlog.contextvars.clear_contextvars()
