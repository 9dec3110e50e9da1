"""Download units (`agent.downloads`): sharing, scope tags in Job names, which Jobs belong
to a unit."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.agent import downloads
from localcache.agent.jobs import jobs
from localcache.api import modelnode
from localcache.caching import keys

URI = "s3://mybucket/mymodel"
NODE = "node-1"
JOB_NS = "kserve-localmodel-jobs"
SUFFIX = "abcd1234"


def _entry(name: str, uri: str = URI, **fields: Any) -> modelnode.LocalModelInfo:
    return modelnode.LocalModelInfo.model_validate(
        {"sourceModelUri": uri, "modelName": name, **fields}
    )


def _units(*entries: modelnode.LocalModelInfo) -> list[downloads.Unit]:
    return downloads.units(list(entries), node_name=NODE, job_namespace=JOB_NS)


# ---- units and sharing ------------------------------------------------------------------
def test_a_tenants_download_without_credentials_is_never_the_open_copy() -> None:
    """Security review finding 3: a namespace cache's Job runs in the tenant's namespace,
    where the tenant may exec into its pod and write the bytes; cluster caches without
    credentials (Jobs in jobNamespace) are the open scope."""
    cluster, tenant, other = _units(
        _entry("cluster"),
        _entry("tenant", namespace="team-a"),
        _entry("again", namespace="team-b"),
    )
    assert cluster.status_keys == ["cluster"]
    assert cluster.scope is None
    assert cluster.tag == cluster.open_tag
    assert tenant.scope == ("team-a",)
    assert tenant.tag != tenant.open_tag
    assert other.scope == ("team-b",)
    assert len({cluster.tag, tenant.tag, other.tag}) == 3
    # the open copy is good for the tenant; the tenant's copy is not good for anyone else
    assert tenant.reuses(cluster.tag + "-0-abcd1234")
    assert not cluster.reuses(tenant.tag + "-0-abcd1234")
    assert not other.reuses(tenant.tag + "-0-abcd1234")


def test_different_credential_scopes_of_one_uri_are_separate_units() -> None:
    units = _units(
        _entry("a", namespace="team-a", serviceAccountName="reader"),
        _entry("b", namespace="team-b", serviceAccountName="reader"),
        _entry("open"),
    )
    assert [u.status_keys for u in units] == [["team-a/a"], ["team-b/b"], ["open"]]
    assert len({u.tag for u in units}) == 3
    assert {u.storage_key for u in units} == {keys.storage_key(URI)}


def test_same_scope_shares_a_unit() -> None:
    """Cluster entries share jobNamespace's scope; a namespace entry with the same account
    name in jobNamespace is the same scope too."""
    [unit] = _units(
        _entry("a", serviceAccountName="reader"),
        _entry("b", serviceAccountName="reader"),
        _entry("c", namespace=JOB_NS, serviceAccountName="reader"),
    )
    assert unit.status_keys == ["a", "b", f"{JOB_NS}/c"]


def test_different_uris_are_different_units_in_spec_order() -> None:
    units = _units(_entry("x", "s3://b/x"), _entry("y", "s3://b/y"), _entry("x2", "s3://b/x"))
    assert [u.status_keys for u in units] == [["x", "x2"], ["y"]]


def test_unit_reuses_open_and_own_scope_downloads_only() -> None:
    [scoped, other, open_] = _units(
        _entry("a", namespace="team-a", serviceAccountName="reader"),
        _entry("b", namespace="team-b", serviceAccountName="reader"),
        _entry("open"),
    )
    own_job = f"{scoped.tag}-3-{SUFFIX}"
    open_job = f"{open_.tag}-0-{SUFFIX}"
    assert scoped.reuses(own_job)
    assert scoped.reuses(open_job)
    assert not scoped.reuses(f"{other.tag}-0-{SUFFIX}")
    assert not open_.reuses(own_job), "a download with credentials is not free for all"
    assert not scoped.reuses(None)
    assert not scoped.reuses("iris-node-1-abcde")


def test_unit_tag_is_the_job_name_without_attempt_and_suffix() -> None:
    [unit] = _units(_entry("iris"))
    name = jobs.job_name(
        storage_key=unit.storage_key, node_name=NODE, attempt=7, scope=None, suffix=SUFFIX
    )
    assert name == f"{unit.tag}-7-{SUFFIX}"
    assert downloads.parse_job_name(name) == (unit.storage_key, unit.tag, 7)
    assert downloads.tag_of(name) == unit.tag


def test_scope_tag_in_job_names_has_64_bits() -> None:
    """Risk 5: a 32-bit tag let colliding scopes be found by brute force."""
    [unit] = _units(_entry("iris", namespace="team-a", serviceAccountName="reader"))
    digest = unit.tag.rpartition("-")[2]
    assert len(digest) * 4 >= 64
    assert len(unit.scope_id) == 64, "units and Job records use the full SHA-256 of the scope"


def test_units_are_grouped_by_full_scope_not_by_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even if two scopes' tags collided, their entries stay separate units."""
    monkeypatch.setattr(downloads, "unit_tag", lambda **_: "lmd-0000000000000000-0000000000000000")
    units = _units(
        _entry("a", namespace="team-a", serviceAccountName="reader"),
        _entry("b", namespace="team-b", serviceAccountName="reader"),
    )
    assert [u.status_keys for u in units] == [["team-a/a"], ["team-b/b"]]
    assert units[0].tag == units[1].tag
    assert units[0].scope_id != units[1].scope_id


@pytest.mark.parametrize(
    "name",
    [
        "iris-node-1-abcde",
        "lmd-0123456789abcdef-0123abcd-0",
        "lmd-0123456789abcdef-0123456789abcdef-0",
        "lmd-0123456789abcdef-0123456789abcdef-01-abcd1234",
        "lmd-0123456789ABCDEF-0123456789abcdef-0-abcd1234",
        "lmd-0123456789abcdef-0123456789abcdef-0-abcd123",
        "x-lmd-0123456789abcdef-0123456789abcdef-0-abcd1234",
        "",
    ],
)
def test_foreign_job_names_are_not_ours(name: str) -> None:
    assert downloads.parse_job_name(name) is None
    assert downloads.tag_of(name) is None


def _ref(
    unit: downloads.Unit, *, namespace: str, attempt: int = 0, **fields: Any
) -> downloads.JobRef:
    values: dict[str, Any] = {
        "namespace": namespace,
        "name": f"{unit.tag}-{attempt}-{SUFFIX}",
        "uid": f"uid-{attempt}",
        "status_key": unit.status_keys[0],
        "storage_key": unit.storage_key,
        "scope": unit.scope_id,
        "attempt": attempt,
        "obj": {},
        **fields,
    }
    return downloads.JobRef(**values)


def test_wanted_jobs_match_by_entry_storage_key_and_full_scope() -> None:
    long_name = "m" * 80
    units = _units(_entry(long_name, namespace="n" * 63))
    [unit] = units
    ref = _ref(unit, namespace="n" * 63)
    assert ref.identity in downloads.wanted_jobs(units)
    changed = _units(_entry(long_name, namespace="n" * 63, serviceAccountName="sa"))
    assert ref.identity not in downloads.wanted_jobs(changed)


def test_unit_jobs_are_its_scope_in_its_namespaces_oldest_first() -> None:
    [unit, other] = _units(
        _entry("a", namespace="team-a", serviceAccountName="reader"),
        _entry("b", namespace="team-b", serviceAccountName="reader"),
    )
    assert unit.namespaces == {"team-a"}
    second, first = _ref(unit, namespace="team-a", attempt=1), _ref(unit, namespace="team-a")
    elsewhere = _ref(unit, namespace="team-b", attempt=2)
    others = _ref(other, namespace="team-b")
    assert downloads.unit_jobs(unit, [second, elsewhere, others, first]) == [first, second]


def test_a_folder_downloaded_under_a_32_bit_tag_is_reused_after_the_upgrade() -> None:
    """Manifests and status of earlier versions name Jobs `lmd-<key>-<8 hex>-<attempt>`: the
    same scope's folder is reused (no download again), another scope's is not."""
    (unit,) = _units(_entry("a", namespace="team-a", serviceAccountName="reader"))
    (other,) = _units(_entry("b", namespace="team-b", serviceAccountName="writer"))
    legacy = f"{unit.tag[:-8]}-0"
    assert unit.reuses(legacy)
    assert not other.reuses(legacy)
    assert unit.reuses(f"{unit.open_tag[:-8]}-3")
    assert not unit.reuses(f"{unit.tag[:-8]}x-0")


def test_entries_served_on_different_places_are_different_units() -> None:
    """Issue 20: a URI on groups whose PVs lie on two roots is downloaded onto each; an entry
    whose node group cannot be served is a unit of its own, so its error stays its own."""
    places = {"gpu": "/mnt/models", "kserve": "/models", "gone": "!gone", "also-gpu": "/mnt/models"}
    entries = [
        _entry("a", nodeGroup="gpu"),
        _entry("b", nodeGroup="kserve"),
        _entry("c", nodeGroup="gone"),
        _entry("d", nodeGroup="also-gpu"),
    ]
    units = downloads.units(
        entries,
        node_name=NODE,
        job_namespace=JOB_NS,
        place=lambda e: places[e.node_group or ""],
    )
    assert [u.status_keys for u in units] == [["a", "d"], ["b"], ["c"]]
    assert len({u.scope_id for u in units}) == 1, "one credential scope, three places"
