"""Expected failures of every subcommand end in one line on stderr and a non-zero exit, never a
traceback (issue 14 item 6). The CLI runs as a subprocess, as a user runs it; nothing here
needs an apiserver (an unreachable one is a loopback port nobody listens on)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from localcache.devenv.assets import free_port


def _localcache(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    env["HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "localcache", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd=home,
    )


def _node(command: str) -> list[str]:
    return ["--node-name", "n"] if command == "agent" else []


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "dead",
                "contexts": [{"name": "dead", "context": {"cluster": "c", "user": "u"}}],
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "not-a-secret"}}],
            }
        )
    )
    return path


def _assert_one_line(done: subprocess.CompletedProcess[str], prefix: str, *needles: str) -> None:
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(prefix), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("command", ["controller", "agent"])
def test_a_kubeconfig_that_does_not_exist(command: str, tmp_path: Path) -> None:
    done = _localcache(command, "--kubeconfig", "/nonexistent", *_node(command), home=tmp_path)
    _assert_one_line(
        done, f"localcache {command}: error: ", "kubeconfig /nonexistent: no such file"
    )


@pytest.mark.parametrize(
    "content",
    ["garbage:\n", "clusters: 5\ncontexts: [1]\ncurrent-context: x\n", "\x00\x01: [\n"],
    ids=["no-context", "wrong-shape", "not-yaml"],
)
@pytest.mark.parametrize("command", ["controller", "agent"])
def test_a_kubeconfig_that_is_garbage(command: str, content: str, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.kubeconfig"
    garbage.write_text(content)
    done = _localcache(command, "--kubeconfig", str(garbage), *_node(command), home=tmp_path)
    _assert_one_line(done, f"localcache {command}: error: ", f"kubeconfig {garbage} is unusable")


@pytest.mark.parametrize("command", ["controller", "agent"])
def test_an_unreachable_apiserver(command: str, tmp_path: Path) -> None:
    server = f"https://127.0.0.1:{free_port()}"
    config = _kubeconfig(tmp_path / "dead.kubeconfig", server)
    done = _localcache(command, "--kubeconfig", str(config), *_node(command), home=tmp_path)
    _assert_one_line(
        done, f"localcache {command}: error: ", f"the apiserver {server}", "does not answer"
    )
    assert "not-a-secret" not in done.stderr


def test_no_kubeconfig_at_all(tmp_path: Path) -> None:
    done = _localcache("controller", home=tmp_path)
    _assert_one_line(done, "localcache controller: error: ", f"{tmp_path}/.kube/config")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["http://[::1", "d"], "invalid URI"),
        (["my-model", "d"], "unsupported URI scheme"),
        (["http://example.invalid/m", ""], "DEST must name"),
        (["file:///nonexistent-model", "d"], "no such file or directory"),
    ],
    ids=["bad-uri", "no-scheme", "empty-destination", "missing-source"],
)
def test_download_with_bad_input(args: list[str], needle: str, tmp_path: Path) -> None:
    done = _localcache("download", *args, home=tmp_path)
    _assert_one_line(done, "localcache download: error: ", needle)


def test_download_into_a_file_that_is_not_a_directory(tmp_path: Path) -> None:
    source = tmp_path / "model.txt"
    source.write_text("weights")
    (tmp_path / "taken").write_text("")
    done = _localcache("download", source.as_uri(), str(tmp_path / "taken"), home=tmp_path)
    _assert_one_line(done, "localcache download: error: ", "is not a directory")


def test_run_without_the_development_environment_says_so_in_one_line(tmp_path: Path) -> None:
    """The image and the wheel hold no localcache.devenv: `localcache run` there ends with one
    line naming what is missing and what to run instead."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    env["HOME"] = str(tmp_path)
    program = (
        "import sys\n"
        "sys.modules['localcache.devenv'] = None  # as where the package is not installed\n"
        "from localcache import cli\n"
        "sys.exit(cli.main(['run']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True, text=True, timeout=60, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    _assert_one_line(
        done, "localcache run: error:", "needs a clone", "localcache controller", "localcache agent"
    )
