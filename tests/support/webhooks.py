"""Admission webhooks in integration tests: a TLS server the real apiserver calls, webhook
configurations that point at it, and waiting until the apiserver really uses them.

- `run_webhook_server(server)` serves an `AdmissionServer` on 127.0.0.1 and a free port with a
  certificate from a fresh `TinyCA`; `WebhookServer.stop()` takes it down early (outage tests).
- `webhook_entry()`/`rule()`/`configuration()` build admissionregistration.k8s.io/v1 objects
  with `clientConfig.url` (envtest-style); `installed()` creates one and deletes it afterwards.
- `wait_until_called()` is the answer to the propagation lag: a configuration that the API
  returns is not yet *effective* (the apiserver picks it up through an informer), so it repeats
  a probe (typically `api_request(..., dry_run=True)`) until the server saw a new request.
- `api_request()` is one apiserver request that also returns the `Warning` headers (the
  harness's `rest()` drops headers). It runs in a worker thread: the harness is blocking and
  the webhook server runs on the test's event loop, so a blocking call there would deadlock.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import re
import tempfile
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from localcache.devenv import assets, certs, controlplane, waiting
from localcache.runtime.serving import admission
from localcache.runtime.serving import tls as tls_mod

ConfigurationKind = Literal["Mutating", "Validating"]
_API = "/apis/admissionregistration.k8s.io/v1"


@dataclass
class WebhookServer:
    """A running admission server: `url(path)` for configurations, `ca_pem` for caBundle."""

    server: admission.AdmissionServer
    host: str
    port: int
    ca_pem: bytes
    cert_dir: Path
    _stack: contextlib.AsyncExitStack = field(repr=False)
    running: bool = True

    def url(self, path: str) -> str:
        return f"https://{self.host}:{self.port}{path}"

    def calls(self, path: str) -> int:
        """Requests answered at `path` so far (any result)."""
        return self.server.stats().count(path)

    async def stop(self) -> None:
        """Stop serving now; configurations pointing here stay (failurePolicy tests)."""
        if self.running:
            self.running = False
            await self._stack.aclose()


@contextlib.asynccontextmanager
async def run_webhook_server(
    server: admission.AdmissionServer, *, host: str = "127.0.0.1", port: int | None = None
) -> AsyncIterator[WebhookServer]:
    """Serve `server` over TLS on `host` and a free (or given) port until the block exits."""
    ca = certs.TinyCA("localcache-test-webhook-ca")
    pair = ca.serving_cert([host, "localhost"])
    with tempfile.TemporaryDirectory(prefix="localcache-webhook-") as tmp:
        cert_dir = Path(tmp)
        (cert_dir / "tls.crt").write_bytes(pair.cert_pem)
        (cert_dir / "tls.key").write_bytes(pair.key_pem)
        (cert_dir / "ca.crt").write_bytes(ca.cert_pem)
        tls = tls_mod.ReloadableTLS(cert_dir / "tls.crt", cert_dir / "tls.key")
        stack = contextlib.AsyncExitStack()
        bound = await stack.enter_async_context(
            tls_mod.serve(
                server.app(),
                host=host,
                port=port if port is not None else assets.free_port(),
                ssl_context=tls.context,
                shutdown_timeout_s=1.0,
            )
        )
        handle = WebhookServer(server, host, bound, ca.cert_pem, cert_dir, stack)
        try:
            yield handle
        finally:
            await handle.stop()


def rule(
    *,
    resources: Sequence[str] = ("configmaps",),
    api_groups: Sequence[str] = ("",),
    api_versions: Sequence[str] = ("v1",),
    operations: Sequence[str] = ("CREATE", "UPDATE"),
    scope: str = "Namespaced",
) -> dict[str, Any]:
    return {
        "apiGroups": list(api_groups),
        "apiVersions": list(api_versions),
        "resources": list(resources),
        "operations": list(operations),
        "scope": scope,
    }


def namespace_selector(namespace: str) -> dict[str, Any]:
    """Only objects in `namespace` (the label every namespace gets), so other tests are safe."""
    return {"matchLabels": {"kubernetes.io/metadata.name": namespace}}


def webhook_entry(
    name: str,
    *,
    url: str,
    ca_pem: bytes,
    rules: Sequence[Mapping[str, Any]],
    failure_policy: Literal["Fail", "Ignore"] = "Fail",
    namespace: str | None = None,
    object_selector: Mapping[str, Any] | None = None,
    timeout_seconds: int = 5,
) -> dict[str, Any]:
    """One webhook entry calling `url`; scoped to `namespace` when given."""
    entry: dict[str, Any] = {
        "name": name,
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
        "rules": [dict(r) for r in rules],
        "failurePolicy": failure_policy,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": timeout_seconds,
    }
    if namespace is not None:
        entry["namespaceSelector"] = namespace_selector(namespace)
    if object_selector is not None:
        entry["objectSelector"] = dict(object_selector)
    return entry


def configuration(
    kind: ConfigurationKind, name: str, webhooks: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": f"{kind}WebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [dict(w) for w in webhooks],
    }


def _collection(config: Mapping[str, Any]) -> str:
    return f"{_API}/{str(config['kind']).lower()}s"


@contextlib.asynccontextmanager
async def installed(
    plane: controlplane.ControlPlane, config: dict[str, Any]
) -> AsyncIterator[dict[str, Any]]:
    """Create `config` (replacing a leftover of the same name); delete it on exit."""
    name = config["metadata"]["name"]
    status, body = await asyncio.to_thread(plane.rest, "POST", _collection(config), config)
    if status == 409:
        await asyncio.to_thread(plane.rest, "DELETE", f"{_collection(config)}/{name}")
        status, body = await asyncio.to_thread(plane.rest, "POST", _collection(config), config)
    if status != 201:
        raise AssertionError(f"creating {config['kind']} {name}: {status} {body}")
    try:
        yield body
    finally:
        await asyncio.to_thread(plane.rest, "DELETE", f"{_collection(config)}/{name}")


@dataclass(frozen=True)
class ApiAnswer:
    """An apiserver answer: status, decoded body, and the text of its `Warning` headers."""

    status: int
    body: Any
    warnings: tuple[str, ...]

    @property
    def message(self) -> str:
        return str(self.body.get("message", "")) if isinstance(self.body, dict) else str(self.body)


_WARNING = re.compile(r'^\d{3} \S+ "(?P<text>(?:[^"\\]|\\.)*)"')


def _warning_text(header: str) -> str:
    match = _WARNING.match(header)
    return match.group("text").replace('\\"', '"') if match else header


def _request_sync(
    plane: controlplane.ControlPlane, method: str, path: str, body: Any, timeout: float
) -> ApiAnswer:
    conn = http.client.HTTPSConnection(
        f"127.0.0.1:{plane.api_port}", timeout=timeout, context=plane.ssl_context()
    )
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        raw = resp.read().decode(errors="replace")
        warnings = tuple(_warning_text(h) for h in resp.headers.get_all("Warning") or [])
    finally:
        conn.close()
    try:
        decoded: Any = json.loads(raw)
    except json.JSONDecodeError:
        decoded = raw
    return ApiAnswer(resp.status, decoded, warnings)


async def api_request(
    plane: controlplane.ControlPlane,
    method: str,
    path: str,
    body: Any = None,
    *,
    dry_run: bool = False,
    timeout_s: float = 15.0,
) -> ApiAnswer:
    """One request as the admin user, off the event loop; `dry_run` adds `dryRun=All`."""
    if dry_run:
        sep = "&" if "?" in path else "?"
        path = f"{path}{sep}{urllib.parse.urlencode({'dryRun': 'All'})}"
    return await asyncio.to_thread(_request_sync, plane, method, path, body, timeout_s)


async def wait_until_called(
    server: WebhookServer,
    path: str,
    probe: Callable[[], Awaitable[object]],
    *,
    timeout_s: float = 30.0,
) -> None:
    """Repeat `probe` (a dry-run request the webhook at `path` should see) until the server
    has answered a new request at `path`: the configuration is then in effect."""

    async def was_called() -> bool:
        before = server.calls(path)
        await probe()
        return server.calls(path) > before

    # wait_until's `T | Awaitable[T]` does not infer T from a coroutine function: say it.
    called = cast("Callable[[], bool | Awaitable[bool]]", was_called)
    await waiting.wait_until(
        called,
        timeout=timeout_s,
        interval=0.1,
        what=f"the apiserver calls the webhook at {server.url(path)}",
    )
