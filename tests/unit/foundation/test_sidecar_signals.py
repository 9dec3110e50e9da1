"""localcache's sidecars (`origin-sums --sidecar`, `import progress`) hold SIGTERM from the
command's first lines (`localcache.__main__`): the kubelet may stop one while it still loads,
and as its container's PID 1 it would drop a signal it neither handles nor holds."""

from __future__ import annotations

import importlib.metadata
import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from localcache import __main__ as entry

PAUSED_AT_LOAD = """
import importlib, sys
class PauseAtLoad:  # the command's modules are about to load: say so, wait for the test
    def find_spec(self, name, path=None, target=None):
        if name == "localcache.cli":
            sys.meta_path.remove(self)
            print("loading", flush=True)
            sys.stdin.readline()
sys.meta_path.insert(0, PauseAtLoad())
module, _, function = sys.argv[1].partition(":")
sys.argv = ["localcache", *sys.argv[2:]]
sys.exit(getattr(importlib.import_module(module), function)())
"""


@pytest.mark.parametrize(
    ("args", "held"),
    [
        (["origin-sums", "s3://b/m", "/dest", "--sidecar"], True),
        (["import", "progress", "--dir", "/data"], True),
        (["origin-sums", "s3://b/m", "/dest"], False),
        (["download", "s3://b/m", "/dest", "--sidecar"], False),
        (["import", "place", "--models", "/m", "--key", "k"], False),
        (["--sidecar", "origin-sums"], False),
        (["agent"], False),
        ([], False),
    ],
)
def test_only_the_sidecars_hold_sigterm_from_their_start(args: list[str], held: bool) -> None:
    assert entry.holds_sigterm(args) is held


def _no_pid_namespace() -> str | None:
    """Why this machine cannot give a process a PID namespace of its own; None when it can."""
    try:
        subprocess.run(["unshare", "--pid", "--fork", "true"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return "cannot create a PID namespace here (unshare --pid --fork failed)"
    return None


def _pid_namespace() -> None:
    """Skips where no PID namespace can be made, unless the real-node suite is required."""
    if (why := _no_pid_namespace()) is not None:
        if os.environ.get("LOCALCACHE_REQUIRE_REAL_NODES"):
            pytest.fail(why)
        pytest.skip(why)


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["origin-sums", "s3://models/llm", "{dest}", "--sidecar"], id="origin-sums"),
        pytest.param(["import", "progress", "--dir", "{dest}"], id="import-progress"),
    ],
)
def test_a_sidecar_sent_sigterm_while_it_loads_as_pid_1_exits_0(
    command: list[str], tmp_path: Path
) -> None:
    """The installed `localcache` command as a container's PID 1, sent SIGTERM while its
    modules load (a seed whose download the origin refused at once): it exits 0 once it
    answered. It used to drop the signal and stay until the pod's grace ran out (CI at 2ab350e:
    the refused tenant's Jobs failed 150 s late)."""
    _pid_namespace()
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="localcache")
    args = [a.format(dest=tmp_path) for a in command]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith(("AWS", "STORAGE_", "S3_")) and "PROXY" not in k.upper()
    }
    # nothing listens there; asked unsigned, with no credential chain to walk
    env |= {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "awsAnonymousCredential": "true"}
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", PAUSED_AT_LOAD,
         script.value, *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=env, text=True,
    )  # fmt: skip
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=30), "the command never began to load"
        assert proc.stdout.readline() == "loading\n"
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 1, children
        os.kill(int(children[0]), signal.SIGTERM)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{args[0]} dropped the SIGTERM sent while it loaded, and stays")
        assert code == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
