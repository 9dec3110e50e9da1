"""The stand-in model server and vLLM (hack/runtime-standin/standin.py) that the e2e tests run
as KServe's ServingRuntime and LLMInferenceService container: it reads the files at the model
path KServe's preset gives it, prints their digests, and serves them; run here as a process,
under both of its names."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "hack" / "runtime-standin" / "standin.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def as_vllm(tmp_path: Path) -> Path:
    link = tmp_path / "bin" / "vllm"
    link.parent.mkdir()
    link.symlink_to(SCRIPT)
    return link


def _start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _lines(proc: subprocess.Popen[str], n: int) -> list[dict[str, object]]:
    assert proc.stdout is not None
    return [json.loads(proc.stdout.readline()) for _ in range(n)]


def test_vllm_version_names_no_version(as_vllm: Path) -> None:
    done = subprocess.run([sys.executable, as_vllm, "--version"], capture_output=True,
                          text=True, check=True, timeout=30)  # fmt: skip
    assert done.stdout.strip() == "standin"


def test_vllm_serve_reads_the_model_and_lora_dirs_and_serves_their_digests(
    tmp_path: Path, as_vllm: Path, procs: list[subprocess.Popen[str]]
) -> None:
    model, adapter = tmp_path / "model", tmp_path / "adapter"
    (model / "sub").mkdir(parents=True)
    adapter.mkdir()
    (model / "sub" / "w.bin").write_bytes(b"weights")
    (adapter / "a.bin").write_bytes(b"lora")
    port = _free_port()
    proc = _start([sys.executable, str(as_vllm), "serve", str(model), "--served-model-name",
                   "m", "--port", str(port), "--disable-uvicorn-access-log",
                   "--enable-lora", "--lora-modules", f"sql={adapter}"])  # fmt: skip
    procs.append(proc)
    read, serving = _lines(proc, 2)
    assert read == {
        "event": "model-files", "model_dir": str(model), "error": None,
        "files": {"sub/w.bin": hashlib.sha256(b"weights").hexdigest()},
        "lora": {"sql": {"dir": str(adapter),
                         "files": {"a.bin": hashlib.sha256(b"lora").hexdigest()}}},
    }  # fmt: skip
    assert serving == {"event": "serving", "port": port}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/files", timeout=10) as answer:
        assert json.loads(answer.read()) == read
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as answer:
        assert answer.status == 200


def test_a_missing_model_dir_is_reported_not_fatal(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    port = _free_port()
    proc = _start([sys.executable, str(SCRIPT), f"--model_dir={tmp_path / 'absent'}",
                   f"--http_port={port}"])  # fmt: skip
    procs.append(proc)
    (read,) = _lines(proc, 1)
    assert read["files"] == {}
    assert read["error"] == f"no directory {tmp_path / 'absent'}"
