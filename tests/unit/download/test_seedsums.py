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
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcache import cli
from localcache.agent.disk import originsums
from localcache.api import originpaths
from localcache.devenv.waiting import wait_until_sync
from localcache.download import s3origin, seedsums
from tests.support import objectstore

BUCKET = "models"
LARGE = b"L" * (9 * 1024 * 1024)  # over boto3's 8 MB multipart threshold: read by ranges
CONFIG = b'{"arch": "llama"}'
MANY = 2 * s3origin.HEAD_WORKERS + 3
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
        for i in range(MANY):  # more objects than HEADs at once
            started.put_object(BUCKET, f"many/shard-{i:02}.bin", b"%d" % i, sha256=i % 2 == 0)
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


def test_every_object_of_a_model_is_asked_for_several_at_once(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey, tmp_path: Path
) -> None:
    """The store holds the HEADs: asked one by one, it would never hold more than one."""
    before = store.checksum_heads_held()
    store.hold_checksum_heads(BUCKET, "many/")
    said: list[str] = []
    uri, env = f"s3://{BUCKET}/many", store.s3_env(reader)
    asking = threading.Thread(
        target=lambda: said.append(seedsums.record(uri, tmp_path, env=env, deadline=60))
    )
    asking.start()
    try:
        wait_until_sync(
            lambda: store.checksum_heads_held() - before >= s3origin.HEAD_WORKERS,
            timeout=30,
            what=f"{s3origin.HEAD_WORKERS} HEADs held at once",
        )
    finally:
        store.release_checksum_heads()
        asking.join(60)
    assert said == [f"{MANY} object(s), {(MANY + 1) // 2} with the origin's SHA-256 recorded"]
    assert originsums.read_staged(tmp_path) == tuple(
        (f"shard-{i:02}.bin", hashlib.sha256(b"%d" % i).hexdigest()) for i in range(0, MANY, 2)
    )


def test_an_answer_without_checksums_is_staged_as_such(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey, tmp_path: Path
) -> None:
    """The origin answered and stores no SHA-256: nothing to check, which the agent must tell
    from no answer at all (that copy is served to no peer)."""
    said = seedsums.record(f"s3://{BUCKET}/plain", tmp_path, env=store.s3_env(reader), deadline=60)
    assert said == "1 object(s), none stored with a full-object SHA-256"
    assert originsums.read_staged(tmp_path) == ()


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


def _sidecar(
    dest: Path, env: dict[str, str], uri: str = f"s3://{BUCKET}/llm"
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "localcache", "origin-sums", uri, str(dest), "--sidecar"],
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
        text=True,
    )


def _said(proc: subprocess.Popen[str]) -> str:
    assert proc.stderr is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stderr, selectors.EVENT_READ)
        assert selector.select(timeout=60), "nothing said within 60 s"
    return proc.stderr.readline()


def _end(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def test_as_a_sidecar_it_stays_until_sigterm_and_then_exits_0(
    store: objectstore.ObjectStore, tmp_path: Path
) -> None:
    """Anonymous access (`awsAnonymousCredential`) asks the origin unsigned: this store refuses
    that, as a private bucket would."""
    proc = _sidecar(
        tmp_path, {"AWS_ENDPOINT_URL": store.endpoint, "awsAnonymousCredential": "true"}
    )
    try:
        said = _said(proc)
        assert "no checksums recorded: the origin refused to list" in said, said
        assert "AccessDenied (HTTP 403)" in said, said
        assert proc.poll() is None, "a sidecar that exits is restarted by the kubelet"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert list(tmp_path.iterdir()) == []
    finally:
        _end(proc)


def test_a_sidecar_stopped_before_the_origin_answers_records_the_answer_first(
    store: objectstore.ObjectStore, reader: objectstore.AccessKey, tmp_path: Path
) -> None:
    """The download beside it ended first (a small model, a slow origin): the kubelet's SIGTERM
    must not cut the answer off, or the seed's copy goes unchecked (CI at 8a771cb)."""
    before = store.checksum_heads_held()
    store.hold_checksum_heads(BUCKET, "llm/")
    proc = _sidecar(tmp_path, store.s3_env(reader))
    try:
        wait_until_sync(
            lambda: store.checksum_heads_held() > before,
            timeout=60,
            what="the sidecar's first checksum HEAD reached the store",
        )
        proc.send_signal(signal.SIGTERM)
        store.release_checksum_heads()
        assert proc.wait(timeout=60) == 0
        assert originsums.read_staged(tmp_path) == (
            ("weights/model.safetensors", hashlib.sha256(LARGE).hexdigest()),
        )
    finally:
        store.release_checksum_heads()
        _end(proc)


def test_the_temporary_file_of_a_stopped_sidecar_is_removed(tmp_path: Path) -> None:
    (tmp_path / f"{originpaths.STAGED_SUMS}.42.tmp").write_text('{"sha256": {')
    (tmp_path / f"{originpaths.STAGED_SUMS}.backup").write_text("a model's own file")
    (tmp_path / "model.bin").write_bytes(b"weights")
    assert originsums.read_staged(tmp_path) is None
    originsums.drop_staged(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{originpaths.STAGED_SUMS}.backup",
        "model.bin",
    ]


def test_any_failure_of_a_head_leaves_no_record(
    store: objectstore.ObjectStore,
    reader: objectstore.AccessKey,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not only the origin's refusals: a partial answer must never pass for a whole one (the
    agent would take a path it lacks for one whose object has no checksum)."""
    real = originpaths.s3_checksum_sha256

    def flaky(value: object, kind: object) -> str | None:
        if value is None:  # the objects stored without a checksum
            raise RuntimeError("a bug")
        return real(value, kind)  # type: ignore[arg-type]

    monkeypatch.setattr(originpaths, "s3_checksum_sha256", flaky)
    said = seedsums.record(f"s3://{BUCKET}/many", tmp_path, env=store.s3_env(reader), deadline=60)
    assert said == "no checksums recorded: the origin refused a HEAD: RuntimeError"
    assert originsums.read_staged(tmp_path) is None
