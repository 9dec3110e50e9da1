"""structlog set-up: JSON or console output, context from contextvars, secrets redacted.

`configure()` is called once by the composition root. Every log line then carries what was
bound with `structlog.contextvars` in the current task (the controller binds `controller`,
`key` and `reconcile_id` for each reconcile, as `reconcile_context()` does).

`redact_secrets` runs before rendering: the value of any key that looks secret (token,
password, secret, credential, authorization, private/access/client key, key data, …) is
replaced by `[REDACTED]`, recursively through dicts and lists; so are `Bearer …` strings and
the `data`/`stringData` of anything that looks like a Kubernetes Secret. Keys that only *name*
a secret (`secret_name`, `secretKeyRef`, …) are kept, and the object key `key` is not secret.
Not promised: secrets inside free text (an exception message) are not found; don't put them
there.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from localcache.runtime import keys

REDACTED = "[REDACTED]"
_OURS = "_localcache_handler"  # marks the root handler configure() installed

_SECRET_KEY = re.compile(
    r"token|passw(or)?d|secret|credential|authorization|cookie|api[-_]?key|private[-_]?key"
    r"|access[-_]?key|client[-_]?key|key[-_]?data|ssh[-_]?key|tls[-_.]?key|signing[-_]?key",
    re.IGNORECASE,
)
# Keys that name or point at a secret rather than hold one.
_REFERENCE_KEY = re.compile(r"(name|names|ref|namespace|path|file|type|kind)$", re.IGNORECASE)
# A whole value of the form "Bearer <token>".
_BEARER = re.compile(r"^\s*bearer\s+[\w.~+/=-]{8,}\s*$", re.IGNORECASE)


def _is_secret_key(name: str) -> bool:
    return bool(_SECRET_KEY.search(name)) and not _REFERENCE_KEY.search(name)


def _redact(value: Any, depth: int = 0) -> Any:
    if depth > 20:
        return value
    if isinstance(value, str):
        return REDACTED if _BEARER.match(value) else value
    if isinstance(value, Mapping):
        is_secret_object = value.get("kind") == "Secret"
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if isinstance(k, str) and (
                _is_secret_key(k) or (is_secret_object and k in ("data", "stringData"))
            ):
                out[k] = REDACTED
            else:
                out[k] = _redact(v, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_redact(v, depth + 1) for v in value]
    return value


def redact_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: replace secret-looking values with `[REDACTED]` (see module doc)."""
    for k, v in list(event_dict.items()):
        if k == "event":
            continue
        event_dict[k] = REDACTED if _is_secret_key(k) else _redact(v)
    return event_dict


def configure(*, level: str = "info", renderer: Literal["json", "console"] = "json") -> None:
    """Set up structlog and the standard library's root logger (process-wide, once, from the
    composition root).

    `level` is a standard level name; `renderer` "json" for machines, "console" for people.
    Records of libraries that use `logging` (aiohttp, kubernetes_asyncio) go through the same
    processors, redaction included, to the same stream. Loggers are not cached, so loggers
    created (or used) before this call follow it too; a `Controller` resolves its logger
    once when it starts running, so configure before starting controllers.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level: {level!r}")
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_secrets,
    ]
    final: list[Processor] = (
        [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
        if renderer == "json"
        else [structlog.dev.ConsoleRenderer()]
    )
    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), *final],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.stdlib.ExtraAdder(),
                *shared,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _OURS, False):
            root.removeHandler(old)
    setattr(handler, _OURS, True)
    root.addHandler(handler)
    root.setLevel(numeric)


@contextlib.contextmanager
def reconcile_context(*, controller: str, key: keys.ObjectKey, reconcile_id: str) -> Iterator[None]:
    """Bind `controller`, `key` and `reconcile_id` into the log context for one reconcile;
    the previous values (if any) are restored afterwards."""
    tokens = structlog.contextvars.bind_contextvars(
        controller=controller, key=str(key), reconcile_id=reconcile_id
    )
    try:
        yield
    finally:
        structlog.contextvars.reset_contextvars(**tokens)
