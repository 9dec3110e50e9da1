"""The committed manifests/crds are exactly what the models generate (`make manifests`)."""

from __future__ import annotations

from pathlib import Path

from localcache.api import crdgen

CRD_DIR = Path(__file__).resolve().parents[3] / "manifests" / "crds"


def test_committed_crds_match_the_models() -> None:
    stale = crdgen.stale_files(CRD_DIR)
    assert not stale, f"{stale} differ from the models: run `make manifests` and commit"


def test_no_leftover_files_beside_the_generated_crds() -> None:
    present = {p.name for p in CRD_DIR.glob("*.yaml")}
    assert present == set(crdgen.generate()), "remove CRD files the models no longer generate"


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    assert crdgen.main([str(tmp_path)]) == 0
    assert crdgen.main([str(tmp_path), "--check"]) == 0
    target = tmp_path / "localmodelcaches.yaml"
    target.write_text(target.read_text().replace("minItems: 1", "minItems: 0"))
    assert crdgen.main([str(tmp_path), "--check"]) == 1
    assert crdgen.stale_files(tmp_path) == ["localmodelcaches.yaml"]
