"""`localcache run` with a reachable kubeconfig attaches to that cluster and says so with a
banner naming the context, the server, the kubeconfig and the addresses it serves, before
anything else; SIGTERM then stops it cleanly (issue 14 item 7)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from localcache.devenv.assets import free_port
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until_sync


def test_run_against_a_reachable_cluster_prints_a_banner_naming_it(
    control_plane: ControlPlane, crds: list[str], tmp_path: Path
) -> None:
    metrics_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(
        LOCALCACHE_METRICS_PORT=str(metrics_port),
        LOCALCACHE_BIND_ADDRESS="127.0.0.1",
        LOCALCACHE_WEBHOOK_PORT="0",
        LOCALCACHE_LEADER_ELECT="false",
        HOME=str(tmp_path),
    )
    kubeconfig = control_plane.kubeconfig_path
    lines: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-m", "localcache", "run", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tmp_path,
    ) as proc:

        def read() -> None:
            assert proc.stdout is not None
            lines.extend(proc.stdout)

        reader = threading.Thread(target=read, name="run-stdout", daemon=True)
        reader.start()
        try:
            wait_until_sync(
                lambda: sum(set(line.strip()) == {"="} for line in lines) >= 2 or proc.poll(),
                timeout=60,
                what="`localcache run` printed its attach banner",
            )
            wait_until_sync(
                lambda: _answers(f"http://127.0.0.1:{metrics_port}/healthz") or proc.poll(),
                timeout=60,
                what="`localcache run` serves /healthz at the address its banner printed",
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
            reader.join(timeout=10)
    text = "".join(lines)
    assert code == 0, text
    assert "ATTACHING TO AN EXISTING CLUSTER" in text
    assert "context:    localcache-test" in text
    assert f"server:     {control_plane.server}" in text
    assert f"kubeconfig: {kubeconfig}" in text
    assert f"metrics: http://127.0.0.1:{metrics_port}/metrics" in text
    assert "webhooks: off" in text
    assert "running:    controller\n" in text


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:
        return False
