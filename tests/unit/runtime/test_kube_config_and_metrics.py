"""`kube.Kube` without an apiserver: a kubeconfig it cannot use is an `errors.ConfigError`
naming the file (never kubernetes_asyncio's own exception), and a request that gets no
answer still counts in client-go's metrics, with code `<error>`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from localcache.devenv.assets import free_port
from localcache.runtime import errors, kube, metrics


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    return path


async def test_a_missing_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="no such file"):
        await kube.Kube.from_kubeconfig(tmp_path / "absent")
    with pytest.raises(errors.ConfigError, match="not a file"):
        await kube.Kube.from_kubeconfig(tmp_path)


@pytest.mark.parametrize(
    "content",
    [
        "garbage:\n",
        "clusters: 5\ncontexts: [1]\ncurrent-context: x\n",
        "a: [\n",
        "current-context: x\n",
    ],
)
async def test_a_garbage_kubeconfig_is_a_config_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(content)
    with pytest.raises(errors.ConfigError, match=f"kubeconfig {path} is unusable"):
        await kube.Kube.from_kubeconfig(path)


async def test_a_request_without_an_answer_counts_with_code_error(tmp_path: Path) -> None:
    port = free_port()
    registry = metrics.Metrics()
    path = _kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
    async with await kube.Kube.from_kubeconfig(path, request_timeout=5) as client:
        client.instrument(registry.rest_client())
        with pytest.raises(errors.TransportError):
            await client.get(kube.NAMESPACES, "default")
    host = f"127.0.0.1:{port}"
    assert (
        registry.value("rest_client_requests_total", code="<error>", method="GET", host=host) == 1
    )
    assert registry.value("rest_client_request_duration_seconds_count", verb="GET", host=host) == 1
