"""`localcache run` on real nodes refuses the settings it cannot honour (issue 19): there the
operator runs as pods from the shipped manifests, so flags and environment variables meant for
an operator in this process would be ignored. Nothing is built or started here: the real-node
run is a stand-in, and the machine is made to look able to host real nodes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from localcache import app, cli
from localcache import settings as settings_mod
from localcache.devenv import realnodes


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Path]:
    """Real nodes "available"; the kubeconfig paths of the real-node runs started."""
    runs: list[Path] = []

    class RealNodesRun:
        def __init__(self, *, kubeconfig_path: Path, out: Any = None) -> None:
            self.kubeconfig_path = kubeconfig_path

        def say(self, text: str) -> None:
            pass

        def start(self) -> None:
            runs.append(self.kubeconfig_path)

        def wait_ready(self, timeout: float = 0) -> bool:
            return True

        def close(self) -> None:
            pass

    monkeypatch.setattr(realnodes, "unavailable_reason", lambda: None)
    monkeypatch.setattr(realnodes, "RealNodesRun", RealNodesRun)
    monkeypatch.setattr(app, "configure_logging", lambda _settings: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for flag in settings_mod.FLAGS:
        monkeypatch.delenv(flag.env, raising=False)
    return runs


def _run(*flags: str) -> int:
    return cli.main(["run", "--local", "--exit-when-ready", *flags])


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("localcache run: error: "), lines[0]
    return lines[0]


def test_flags_real_nodes_cannot_honour_are_refused_by_name(
    started: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run("--metrics-port", "9000", "--webhook-port", "0") == 1
    line = _error_line(capsys)
    assert "--metrics-port / LOCALCACHE_METRICS_PORT" in line
    assert "--webhook-port / LOCALCACHE_WEBHOOK_PORT" in line
    assert started == [], "real nodes were started although flags were refused"


def test_environment_variables_real_nodes_cannot_honour_are_refused_by_name(
    started: list[Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOCALCACHE_WORKERS", "4")
    monkeypatch.setenv("NODE_NAME", "node-1")  # not a flag of `run`: named by its variable
    assert _run() == 1
    line = _error_line(capsys)
    assert "--workers / LOCALCACHE_WORKERS" in line
    assert "NODE_NAME" in line
    assert "--node-name" not in line
    assert started == []


def test_without_such_flags_real_nodes_run(
    started: list[Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert _run("--log-level", "debug", "--kubeconfig", str(tmp_path / "absent")) == 0
    assert len(started) == 1
    assert "error" not in capsys.readouterr().err


def test_the_sample_is_applied_again_while_the_webhook_cannot_be_called_yet() -> None:
    """CI failure on record (2026-12-02): `localcache run` on real nodes applied the sample
    before the webhook configurations' CA bundle matched the controller's certificate."""
    calls: list[str] = []
    refusal = (
        'Internal error occurred: failed calling webhook "x": tls: failed to verify '
        "certificate: x509: certificate signed by unknown authority"
    )

    def kubectl(
        *args: str, check: bool = True, input_text: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        calls.append(" ".join(args))
        code, err = (1, refusal) if len(calls) < 3 else (0, "")
        return subprocess.CompletedProcess(list(args), code, "", err)

    realnodes.apply_once_admitted(kubectl, "kind: X\n", timeout=10)
    assert calls == ["apply -f -"] * 3

    def denied(
        *args: str, check: bool = True, input_text: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(args), 1, "", "admission webhook denied: bad")

    with pytest.raises(realnodes.RealNodesError, match="denied: bad"):
        realnodes.apply_once_admitted(denied, "kind: X\n", timeout=10)
