"""`localcache origin-sums` (`download.seedsums`): the SHA-256 an `s3://` origin stores for
each object, staged in the download's folder while KServe's storage initializer runs; against
the test object store (moto, credentials enforced). It never fails the download."""

from __future__ import annotations

import hashlib
import os
import selectors
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcache import cli
from localcache.agent.disk import originsums
from localcache.api import originpaths
from localcache.download import seedsums
from tests.support import objectstore

BUCKET = "models"
LARGE = b"L" * (9 * 1024 * 1024)  # over boto3's 8 MB multipart threshold: read by ranges
CONFIG = b'{"arch": "llama"}'
NO_S3: dict[str, object] = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "iam:GetUser", "Resource": "*"}],
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[objectstore.ObjectStore]:
    log = tmp_path_factory.mktemp("objectstore") / "objectstore.log"
    with objectstore.ObjectStore(log_path=log).start() as started:
        started.create_bucket(BUCKET)
        started.put_object(BUCKET, "llm/weights/model.safetensors", LARGE, sha256=True)
        started.put_object(BUCKET, "llm/config.json", CONFIG)  # stored without a checksum
        started.put_object(BUCKET, "plain/config.json", CONFIG)
        yield started


@pytest.fixture(scope="module")
def reader(store: objectstore.ObjectStore) -> objectstore.AccessKey:
    return store.create_user("reader")


def test_the_sha256_the_origin_stores_is_staged_per_folder_path(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey, tmp_path: Path
) -> None:
    said = seedsums.record(f"s3://{BUCKET}/llm", tmp_path, env=store.s3_env(reader), deadline=60)
    assert said == "2 object(s), 1 with the origin's SHA-256 recorded"
    staged = originpaths.StagedSums.model_validate_json(
        (tmp_path / originpaths.STAGED_SUMS).read_text()
    )
    assert staged.sha256 == {"weights/model.safetensors": hashlib.sha256(LARGE).hexdigest()}
    assert [p.name for p in tmp_path.iterdir()] == [originpaths.STAGED_SUMS]  # no temporary


def test_nothing_is_staged_when_no_object_has_a_checksum(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey, tmp_path: Path
) -> None:
    said = seedsums.record(f"s3://{BUCKET}/plain", tmp_path, env=store.s3_env(reader), deadline=60)
    assert said == "1 object(s), none stored with a full-object SHA-256"
    assert list(tmp_path.iterdir()) == []


def test_a_refusal_stages_nothing_and_the_command_still_exits_0(
    store: objectstore.ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    stranger = store.create_user("stranger", policy=NO_S3)
    for name, value in store.s3_env(stranger).items():
        monkeypatch.setenv(name, value)
    assert cli.main(["origin-sums", f"s3://{BUCKET}/llm", str(tmp_path)]) == 0
    assert list(tmp_path.iterdir()) == []
    said = capsys.readouterr().err
    assert "no checksums recorded: the origin refused to list" in said, said
    assert "AccessDenied" in said
    assert stranger.secret_access_key not in said


def test_an_origin_that_never_answers_is_given_up_at_the_deadline(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        env = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{silent.getsockname()[1]}",
            "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "secret",
        }
        said = seedsums.record(f"s3://{BUCKET}/llm", tmp_path, env=env, deadline=0.5)
    assert said == "no checksums recorded: not done within 0.5 s"
    assert list(tmp_path.iterdir()) == []


def test_as_a_sidecar_it_stays_until_sigterm_and_then_exits_0(tmp_path: Path) -> None:
    env = {**os.environ, "awsAnonymousCredential": "true"}  # no network: said at once
    proc = subprocess.Popen(
        [sys.executable, "-m", "localcache", "origin-sums", "s3://b/m", str(tmp_path), "--sidecar"],
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stderr is not None
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stderr, selectors.EVENT_READ)
            assert selector.select(timeout=60), "nothing said within 60 s"
        said = proc.stderr.readline()
        assert "no checksums recorded: anonymous S3 access" in said, said
        assert proc.poll() is None, "a sidecar that exits is restarted by the kubelet"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_the_temporary_file_of_a_stopped_sidecar_is_removed(tmp_path: Path) -> None:
    (tmp_path / f"{originpaths.STAGED_SUMS}.42.tmp").write_text('{"sha256": {')
    (tmp_path / f"{originpaths.STAGED_SUMS}.backup").write_text("a model's own file")
    (tmp_path / "model.bin").write_bytes(b"weights")
    assert originsums.read_staged(tmp_path) == ()
    originsums.drop_staged(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{originpaths.STAGED_SUMS}.backup",
        "model.bin",
    ]
