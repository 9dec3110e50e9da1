"""The model-folder protocol: promotion, crash recovery at every step, safe deletion, progress."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcache.agent.disk import digest, folders, layout, tree
from tests.support.trees import deep_tree

KEY = "0123456789abcdef"
OTHER = "fedcba9876543210"
URI = "s3://bucket/model"
JOB = "iris-node-1-0123456789abcdef-0"


class Crash(Exception):
    """Stands for the agent process dying at a checkpoint."""


def _manifest(job: str = JOB, *, key: str = KEY, uri: str = URI, size: int = 11) -> layout.Manifest:
    return layout.Manifest(
        storage_key=key, uri=uri, bytes=size, completed_at="2026-01-02T03:04:05Z", job=job
    )


def _download(d: folders.ModelDisk, job: str = JOB, *, key: str = KEY) -> Path:
    staging = d.prepare_staging(key, job)
    (staging / "weights").mkdir()
    (staging / "weights" / "model.bin").write_bytes(b"x" * 7)
    (staging / "config.json").write_bytes(b"{}{}")
    return staging


def _promote_crashing_at(monkeypatch: pytest.MonkeyPatch, d: folders.ModelDisk, step: str) -> Path:
    """Download, then promote with the process dying at checkpoint `step`; returns the staging
    folder. Later checkpoints pass again (the "restarted" process)."""
    staging = _download(d)

    def checkpoint(reached: str) -> None:
        if reached == step:
            raise Crash(step)

    monkeypatch.setattr(folders, "_checkpoint", checkpoint)
    with pytest.raises(Crash):
        d.promote(staging, KEY, _manifest())
    monkeypatch.setattr(folders, "_checkpoint", lambda _step: None)
    return staging


def _assert_promoted(d: folders.ModelDisk, *, job: str = JOB) -> None:
    assert d.is_complete(KEY)
    assert (d.model_path(KEY) / "weights" / "model.bin").read_bytes() == b"x" * 7
    in_force = d.manifest(KEY)
    assert in_force is not None
    assert dataclasses.replace(in_force, digest="") == _manifest(job)
    assert not d.staging_path(KEY, job).exists()
    assert sorted(p.name for p in d.manifests.iterdir() if "." + VARIANT not in p.name) == [
        f"{KEY}.json"
    ]
    assert list(d.trash.iterdir()) == []


def test_layout_matches_what_kserve_pod_mutator_mounts(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    assert d.model_path(KEY) == tmp_path / "models" / KEY
    assert layout.model_subpath(KEY) == f"models/{KEY}"
    assert layout.staging_subpath(KEY, JOB) == f".staging/{KEY}-{JOB}"
    assert d.staging_path(KEY, JOB) == tmp_path / layout.staging_subpath(KEY, JOB)


@pytest.mark.parametrize("bad", ["", "0123456789ABCDEF", "0123456789abcde", "../../etc", "x" * 16])
def test_paths_refuse_names_that_are_not_storage_keys(tmp_path: Path, bad: str) -> None:
    d = folders.ModelDisk(tmp_path)
    with pytest.raises(layout.DiskError, match="not a storage key"):
        d.model_path(bad)
    with pytest.raises(layout.DiskError):
        d.staging_path(bad, JOB)


def test_staging_refuses_a_job_name_that_could_escape_the_folder(tmp_path: Path) -> None:
    with pytest.raises(layout.DiskError, match="job name"):
        folders.ModelDisk(tmp_path).staging_path(KEY, "../x")


def test_promote_moves_the_download_into_place_and_records_the_manifest(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    staging = _download(d)
    assert not d.is_complete(KEY)

    in_force = d.promote(staging, KEY, _manifest())

    assert in_force == _manifest()
    _assert_promoted(d)
    on_disk = json.loads((d.manifests / f"{KEY}.json").read_text())
    assert on_disk == {
        "storageKey": KEY,
        "uri": URI,
        "bytes": 11,
        "completedAt": "2026-01-02T03:04:05Z",
        "job": JOB,
    }
    assert d.list_model_folders() == [KEY]


def test_a_download_deeper_than_the_depth_limit_is_refused_not_raised(tmp_path: Path) -> None:
    """Security review findings 4 and 10: a tenant's 1100-level download made the flush raise
    RecursionError on every pass; content past PATH_MAX was published unchecked. Now the
    promotion is refused with a DiskError naming the folder, and the disk goes on working."""
    d = folders.ModelDisk(tmp_path)
    staging = d.prepare_staging(KEY, JOB)
    with deep_tree(staging / "weights", sys.getrecursionlimit() + 100):
        with pytest.raises(layout.DiskError, match="could not check"):
            d.promote(staging, KEY, _manifest(size=1))
        assert not d.is_complete(KEY)
    d.promote(_download(d, key=OTHER), OTHER, _manifest(key=OTHER))
    assert d.is_complete(OTHER)


def test_a_download_within_the_depth_limit_is_published(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    staging = d.prepare_staging(KEY, JOB)
    with deep_tree(staging / "weights", layout.MAX_TREE_DEPTH - 2):
        d.promote(staging, KEY, _manifest(size=1))
    assert d.is_complete(KEY)


def test_a_link_through_the_staging_folders_own_name_is_removed(tmp_path: Path) -> None:
    """Security review finding 11: `../<staging name>/f` resolves inside the staging folder
    and outside once the folder is renamed into place (into the staging area, here)."""
    d = folders.ModelDisk(tmp_path)
    staging = _download(d)
    (staging / "through-own-name").symlink_to(f"../{staging.name}/config.json")
    (staging / "weights" / "inside").symlink_to("../config.json")
    d.promote(staging, KEY, _manifest())
    final = d.model_path(KEY)
    assert not os.path.lexists(final / "through-own-name")
    assert (final / "weights" / "inside").read_bytes() == b"{}{}"


def test_manifest_is_kept_outside_the_model_folder(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    d.promote(_download(d), KEY, _manifest())
    assert sorted(p.name for p in d.model_path(KEY).iterdir()) == ["config.json", "weights"]


def test_promote_keeps_an_existing_complete_folder_and_discards_the_new_download(
    tmp_path: Path,
) -> None:
    d = folders.ModelDisk(tmp_path)
    d.promote(_download(d), KEY, _manifest())
    second = _download(d, "iris-node-1-0123456789abcdef-1")

    in_force = d.promote(second, KEY, _manifest("iris-node-1-0123456789abcdef-1"))

    assert in_force == dataclasses.replace(
        _manifest(), digest=digest.tree_digest(d.model_path(KEY))
    )
    assert in_force.digest.startswith("sha256:")
    _assert_promoted(d)
    assert not second.exists()
    assert d.manifest(KEY) == in_force, "the digest is kept for the next comparison"


VARIANT = "00112233aabbccdd"


def test_a_download_that_differs_becomes_its_scopes_own_folder_never_a_silent_discard(
    tmp_path: Path,
) -> None:
    """Security review finding 3: the first download to finish was served to every scope."""
    d = folders.ModelDisk(tmp_path)
    d.promote(_download(d), KEY, _manifest())
    second = _download(d, "iris-node-1-0123456789abcdef-1")
    (second / "weights" / "model.bin").write_bytes(b"forged!")

    in_force = d.promote(second, KEY, _manifest("iris-node-1-0123456789abcdef-1"), variant=VARIANT)

    assert in_force.variant == VARIANT
    assert in_force.folder == f"{KEY}.{VARIANT}"
    assert d.is_complete(KEY, VARIANT)
    assert (d.model_path(KEY, VARIANT) / "weights" / "model.bin").read_bytes() == b"forged!"
    _assert_promoted(d)  # the first folder is untouched
    assert d.manifest(KEY, VARIANT) == in_force
    assert sorted(d.list_model_folders()) == [KEY, f"{KEY}.{VARIANT}"]
    # the same download promoted again (a retry) finds its variant
    again = d.promote(
        _download(d, "iris-node-1-0123456789abcdef-2"),
        KEY,
        _manifest("iris-node-1-0123456789abcdef-2"),
        variant=VARIANT,
    )
    assert again == in_force


def test_a_differing_download_without_a_scope_is_refused(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    d.promote(_download(d), KEY, _manifest())
    second = _download(d, "iris-node-1-0123456789abcdef-1")
    (second / "config.json").write_bytes(b"[]")
    with pytest.raises(layout.DiskError, match="differs from the complete folder"):
        d.promote(second, KEY, _manifest("iris-node-1-0123456789abcdef-1"))


@pytest.mark.parametrize("step", ["record-written", "renamed", "manifest-written"])
def test_a_crash_while_promoting_a_variant_converges_on_recover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    d = folders.ModelDisk(tmp_path)
    d.promote(_download(d), KEY, _manifest())
    second = _download(d, "iris-node-1-0123456789abcdef-1")
    (second / "weights" / "model.bin").write_bytes(b"other")

    def checkpoint(reached: str) -> None:
        if reached == step:
            raise Crash(step)

    monkeypatch.setattr(folders, "_checkpoint", checkpoint)
    with pytest.raises(Crash):
        d.promote(second, KEY, _manifest("iris-node-1-0123456789abcdef-1"), variant=VARIANT)
    monkeypatch.setattr(folders, "_checkpoint", lambda _step: None)
    d.recover()
    assert d.is_complete(KEY, VARIANT)
    assert (d.model_path(KEY, VARIANT) / "weights" / "model.bin").read_bytes() == b"other"
    assert d.manifest(KEY, VARIANT).variant == VARIANT  # type: ignore[union-attr]
    _assert_promoted(d)


def test_variants_are_deleted_with_their_storage_key(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    d.promote(_download(d), KEY, _manifest())
    second = _download(d, "iris-node-1-0123456789abcdef-1")
    (second / "config.json").write_bytes(b"[]")
    d.promote(second, KEY, _manifest("iris-node-1-0123456789abcdef-1"), variant=VARIANT)
    assert d.delete_unreferenced({KEY}) == []
    assert d.is_complete(KEY, VARIANT)
    assert d.delete_unreferenced(set()) == [KEY]
    assert d.list_model_folders() == []
    assert not d.is_complete(KEY, VARIANT)


def test_promote_replaces_a_folder_that_has_no_manifest(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    partial = d.model_path(KEY)
    partial.mkdir(parents=True)
    (partial / "half.bin").write_bytes(b"?")

    d.promote(_download(d), KEY, _manifest())

    _assert_promoted(d)
    assert not (partial / "half.bin").exists()


def test_promote_refuses_a_manifest_for_another_key_or_a_foreign_folder(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    staging = _download(d)
    with pytest.raises(layout.DiskError, match="manifest is for"):
        d.promote(staging, KEY, _manifest(key=OTHER))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(layout.DiskError, match="not a staging folder"):
        d.promote(elsewhere, KEY, _manifest())
    with pytest.raises(layout.DiskError, match="does not exist"):
        d.promote(d.staging_path(KEY, "gone"), KEY, _manifest())
    assert not d.is_complete(KEY)


def test_promote_refuses_a_different_uri_under_the_same_key(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    d.promote(_download(d), KEY, _manifest())
    with pytest.raises(layout.DiskError, match="already holds"):
        d.promote(_download(d, "other"), KEY, _manifest("other", uri="gs://other"))


@pytest.mark.parametrize(
    "step", ["record-written", "renamed", "manifest-written", "record-removed"]
)
def test_a_crash_at_any_step_of_promote_converges_on_recover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    _promote_crashing_at(monkeypatch, folders.ModelDisk(tmp_path), step)

    restarted = folders.ModelDisk(tmp_path)
    recovered = restarted.recover()

    _assert_promoted(restarted)
    if step == "record-removed":
        assert recovered == []
    else:
        assert [r.storage_key for r in recovered] == [KEY]
    assert restarted.recover() == []  # idempotent


def test_a_crash_after_moving_an_incomplete_folder_aside_converges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = folders.ModelDisk(tmp_path)
    d.model_path(KEY).mkdir(parents=True)
    _promote_crashing_at(monkeypatch, d, "old-moved-aside")

    restarted = folders.ModelDisk(tmp_path)
    assert [r.outcome for r in restarted.recover()] == ["promoted"]
    _assert_promoted(restarted)


@pytest.mark.parametrize(
    ("step", "outcome"),
    [("record-written", "promoted"), ("renamed", "manifest-written")],
)
def test_recover_reports_how_each_interrupted_promotion_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, outcome: layout.Outcome
) -> None:
    staging = _promote_crashing_at(monkeypatch, folders.ModelDisk(tmp_path), step)
    assert folders.ModelDisk(tmp_path).recover() == [
        layout.Recovered(storage_key=KEY, staging=staging.name, outcome=outcome)
    ]


@pytest.mark.parametrize("step", ["record-written", "renamed"])
def test_a_folder_is_never_complete_before_its_manifest_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    d = folders.ModelDisk(tmp_path)
    _promote_crashing_at(monkeypatch, d, step)
    assert not d.is_complete(KEY)


def test_recover_abandons_a_promotion_whose_download_is_gone(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    d.ensure_layout()
    record = {"staging": f"{KEY}-{JOB}", "manifest": _manifest().to_json()}
    (d.manifests / f"{KEY}.promoting.json").write_text(json.dumps(record))

    assert [r.outcome for r in d.recover()] == ["abandoned"]
    assert not d.is_complete(KEY)
    assert list(d.manifests.iterdir()) == []


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"staging": "../../etc", "manifest": _manifest().to_json()}),
        json.dumps({"staging": "..", "manifest": _manifest().to_json()}),
        json.dumps({"staging": f"{OTHER}-{JOB}", "manifest": _manifest().to_json()}),
        json.dumps({"staging": "x", "manifest": _manifest(key=OTHER).to_json()}),
        json.dumps({"manifest": {}}),
    ],
)
def test_recover_drops_unreadable_or_inconsistent_records(tmp_path: Path, content: str) -> None:
    d = folders.ModelDisk(tmp_path)
    d.ensure_layout()
    (d.manifests / f"{KEY}.promoting.json").write_text(content)
    (d.manifests / ".leftover.json.abc.tmp").write_text("{")

    assert d.recover() == []
    assert list(d.manifests.iterdir()) == []


def test_incomplete_states_are_never_reported_complete(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    d.ensure_layout()
    assert not d.is_complete(KEY)  # nothing at all
    d.model_path(KEY).mkdir()
    assert not d.is_complete(KEY)  # folder without manifest (KServe's partial download)
    (d.manifests / f"{KEY}.json").write_text("{broken")
    assert not d.is_complete(KEY)  # unreadable manifest
    (d.manifests / f"{KEY}.json").write_text(json.dumps(_manifest(key=OTHER).to_json()))
    assert not d.is_complete(KEY)  # manifest for another key
    (d.manifests / f"{KEY}.json").write_text(json.dumps(_manifest().to_json()))
    assert d.is_complete(KEY)
    d.model_path(KEY).rmdir()
    assert not d.is_complete(KEY)  # manifest without folder


def test_list_model_folders_only_returns_storage_key_shaped_directories(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    assert d.list_model_folders() == []  # missing root
    d.ensure_layout()
    for name in (KEY, OTHER, "iris", "ABCDEF0123456789", "0123456789abcdef0"):
        (d.models / name).mkdir()
    (d.models / "1111111111111111").write_text("a file, not a folder")
    assert d.list_model_folders() == [KEY, OTHER]


def test_delete_unreferenced_keeps_referenced_and_foreign_folders(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    d.promote(_download(d), KEY, _manifest())
    d.promote(_download(d, key=OTHER), OTHER, _manifest(key=OTHER, uri="gs://other"))
    (d.models / "abc123def456").mkdir()  # KServe's pre-#4887 model-name folder: not ours
    (d.models / "legacy-model").mkdir()

    deleted = d.delete_unreferenced({KEY})

    assert deleted == [OTHER]
    assert d.is_complete(KEY)
    assert not (d.models / OTHER).exists()
    assert d.manifest(OTHER) is None
    assert (d.models / "abc123def456").is_dir()
    assert (d.models / "legacy-model").is_dir()
    assert list(d.trash.iterdir()) == []


def test_delete_unreferenced_cleans_stale_staging_folders(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    running = d.prepare_staging(KEY, "running-job")
    finished_job_gone = d.prepare_staging(KEY, "old-job")
    unreferenced = d.prepare_staging(OTHER, "running-other")
    foreign = d.staging / "not-a-staging-folder"
    foreign.mkdir()

    d.delete_unreferenced({KEY})
    assert running.exists()
    assert finished_job_gone.exists()  # without live_jobs only unreferenced keys go
    assert not unreferenced.exists()

    d.delete_unreferenced({KEY}, live_jobs={"running-job"})
    assert running.exists()
    assert not finished_job_gone.exists()
    assert foreign.exists()


def test_delete_unreferenced_spares_a_staging_folder_awaiting_promotion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = folders.ModelDisk(tmp_path)
    staging = _promote_crashing_at(monkeypatch, d, "record-written")
    d.delete_unreferenced({KEY}, live_jobs=set())  # the Job has been TTL-deleted
    assert staging.exists()


def test_delete_unreferenced_drops_orphan_manifests_of_unreferenced_keys(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    d.ensure_layout()
    (d.manifests / f"{OTHER}.json").write_text(json.dumps(_manifest(key=OTHER).to_json()))
    (d.manifests / f"{KEY}.json").write_text(json.dumps(_manifest().to_json()))
    d.delete_unreferenced({KEY})
    assert [p.name for p in d.manifests.iterdir()] == [f"{KEY}.json"]


_NAMES = st.one_of(
    st.text(alphabet="0123456789abcdef", min_size=16, max_size=16),
    st.text(alphabet="0123456789abcdefABCDEF-xyz", min_size=1, max_size=20),
)


@settings(max_examples=60, deadline=None)
@given(names=st.sets(_NAMES, max_size=8), data=st.data())
def test_deletion_never_touches_referenced_or_foreign_names(
    names: set[str], data: st.DataObject
) -> None:
    referenced = data.draw(st.sets(st.sampled_from(sorted(names)))) if names else set()
    with tempfile.TemporaryDirectory() as tmp:
        d = folders.ModelDisk(Path(tmp))
        d.ensure_layout()
        for name in names:
            (d.models / name).mkdir()

        d.delete_unreferenced(referenced)

        left = set(os.listdir(d.models))
        gone = {n for n in names if layout.is_storage_key(n) and n not in referenced}
        assert left == names - gone


def test_folder_bytes_counts_regular_files_without_following_symlinks(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b").mkdir()
    (tmp_path / "x").write_bytes(b"1" * 10)
    (tmp_path / "a" / "y").write_bytes(b"2" * 20)
    (tmp_path / "a" / "b" / "z").write_bytes(b"3" * 30)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"4" * 1000)
    (tmp_path / "link").symlink_to(outside)
    assert tree.folder_bytes(tmp_path) == 60
    assert tree.folder_bytes(tmp_path / "missing") == 0


def test_prepare_staging_makes_an_empty_folder_not_world_writable(tmp_path: Path) -> None:
    d = folders.ModelDisk(tmp_path)
    path = d.prepare_staging(KEY, JOB)
    assert path.is_dir()
    assert path.stat().st_mode & 0o7777 == layout.STAGING_MODE
    assert d.prepare_staging(KEY, JOB) == path  # idempotent
    d.remove_staging(KEY, JOB)
    assert not path.exists()


def test_a_fifo_in_a_download_does_not_hang_promotion(tmp_path: Path) -> None:
    """Issue 13: the agent fsynced every file with a blocking open; a FIFO hung it for good."""
    import concurrent.futures

    d = folders.ModelDisk(tmp_path)
    staging = _download(d)
    os.mkfifo(staging / "weights" / "pipe")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        done = pool.submit(d.promote, staging, KEY, _manifest())
        try:
            done.result(timeout=10)
        except concurrent.futures.TimeoutError:
            with open(d.model_path(KEY) / "weights" / "pipe", "wb"):  # unblock the reader
                pass
            pytest.fail("promotion hung on a FIFO")
    _assert_promoted(d)


@pytest.mark.parametrize("linked", [layout.TRASH_DIR, layout.STAGING_DIR])
def test_a_scratch_directory_replaced_by_a_symlink_is_repaired_and_deletes_nothing(
    tmp_path: Path, linked: str
) -> None:
    """Issue 13: `.trash` linked to `models` made one normal pass delete every model. Now the
    link is removed without being followed, the directory recreated, and the pass goes on."""
    d = folders.ModelDisk(tmp_path)
    d.promote(_download(d), KEY, _manifest())
    d.promote(_download(d, key=OTHER), OTHER, _manifest(key=OTHER))
    target = tmp_path / linked
    target.rename(tmp_path / f"{linked}.moved-aside")
    target.symlink_to(d.models)
    (repaired,) = d.ensure_layout()
    assert f"{target} was a symlink" in repaired
    assert target.is_dir()
    assert not target.is_symlink()
    assert d.ensure_layout() == []
    d.delete_unreferenced({KEY})
    assert (d.models / KEY / "weights" / "model.bin").is_file()
    assert not (d.models / OTHER).exists()
    assert not any((tmp_path / layout.TRASH_DIR).iterdir())


@pytest.mark.parametrize("linked", [layout.MODELS_DIR, layout.MANIFESTS_DIR])
def test_a_models_or_manifests_directory_replaced_by_a_symlink_is_refused(
    tmp_path: Path, linked: str
) -> None:
    """`models` and `.manifests` hold the node's models and their records: never repaired
    by the agent, every pass refuses to move or delete anything."""
    d = folders.ModelDisk(tmp_path)
    d.promote(_download(d), KEY, _manifest())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = tmp_path / linked
    target.rename(tmp_path / f"{linked}.moved-aside")
    target.symlink_to(elsewhere)
    with pytest.raises(layout.DiskError, match="symlink"):
        d.ensure_layout()
    assert target.is_symlink()
    assert (tmp_path / f"{linked}.moved-aside").is_dir()


def test_a_record_that_cannot_be_settled_is_quarantined_and_the_others_recover(
    tmp_path: Path,
) -> None:
    """Security review finding 8: a promotion that raises (here a storage-key collision) made
    recover() raise on every pass, so that node's agent never reconciled again."""
    d = folders.ModelDisk(tmp_path)
    d.promote(_download(d), KEY, _manifest())  # KEY holds URI
    clash = _download(d, "other")
    record = {"staging": clash.name, "manifest": _manifest("other", uri="gs://other").to_json()}
    (d.manifests / f"{KEY}{layout.RECORD_SUFFIX}").write_text(json.dumps(record))
    fine = _download(d, key=OTHER)
    record = {"staging": fine.name, "manifest": _manifest(key=OTHER).to_json()}
    (d.manifests / f"{OTHER}{layout.RECORD_SUFFIX}").write_text(json.dumps(record))

    recovered = {r.storage_key: r for r in d.recover()}

    assert recovered[KEY].outcome == "quarantined"
    assert "already holds" in recovered[KEY].error
    assert recovered[OTHER].outcome == "promoted"
    assert d.is_complete(OTHER)
    assert d.manifest(KEY) == _manifest()  # the folder in place is untouched
    quarantined = d.manifests / f"{KEY}{layout.RECORD_SUFFIX}{layout.QUARANTINE_SUFFIX}"
    assert quarantined.is_file()
    assert d.recover() == []  # never read again


def test_a_job_record_lives_as_long_as_its_staging_folder(tmp_path: Path) -> None:
    """What the CSI node plugin reads to show a download pod its staging folder."""
    d = folders.ModelDisk(tmp_path)
    d.ensure_layout()
    staging = d.prepare_staging(KEY, JOB)
    d.record_job(JOB, namespace="team", status_key="team/iris", storage_key=KEY)
    record = json.loads((d.jobs / f"{JOB}.json").read_text())
    assert record == {"namespace": "team", "statusKey": "team/iris", "storageKey": KEY}
    d.delete_unreferenced({KEY}, live_jobs={JOB})
    assert (d.jobs / f"{JOB}.json").exists()
    d.promote(staging, KEY, _manifest())
    d.delete_unreferenced({KEY}, live_jobs=set())
    assert not (d.jobs / f"{JOB}.json").exists()
    with pytest.raises(layout.DiskError):
        d.record_job("../x", namespace="team", status_key="team/iris", storage_key=KEY)
