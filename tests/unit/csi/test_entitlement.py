"""What a pod may see of a localcache volume (localcache.csi.entitlement): pure decisions."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.caching import keys
from localcache.csi import entitlement

URI = "s3://bucket/bert"
KEY = keys.storage_key(URI)
NODE = "node-1"


def _attributes(role: str = "serving", cache: str = "team/bert", **extra: str) -> dict[str, str]:
    return {
        entitlement.ROLE: role,
        entitlement.CACHE: cache,
        entitlement.STORAGE_KEY: KEY,
        entitlement.ROOT: "/mnt/models/",
        entitlement.POD_NAMESPACE: "team",
        entitlement.POD_NAME: "predictor-abc",
        entitlement.POD_UID: "uid-1",
        **extra,
    }


def _node(status: str | None = "ModelDownloaded", **extra: Any) -> dict[str, Any]:
    return {
        "spec": {
            "localModels": [
                {"sourceModelUri": URI, "modelName": "bert", "namespace": "team"},
                {"sourceModelUri": "s3://other/x", "modelName": "open"},
            ]
        },
        "status": {"modelStatus": {"team/bert": status} if status else {}, **extra},
    }


def _decide(
    attributes: dict[str, str],
    node: dict[str, Any],
    *,
    record: dict[str, Any] | None = None,
    variants: tuple[str, ...] = (),
) -> entitlement.Grant:
    volume = entitlement.Volume.of(attributes)
    return entitlement.decide(
        volume,
        entitlement.Pod.of(attributes),
        node=node,
        node_name=NODE,
        job_record=record,
        variants=variants,
    )


def test_a_downloaded_cache_shows_its_own_folder_read_only() -> None:
    grant = _decide(_attributes(), _node())
    assert grant == entitlement.Grant(f"models/{KEY}", writable=False)
    assert entitlement.Volume.of(_attributes()).root == "/mnt/models"


@pytest.mark.parametrize(
    ("status", "why"),
    [
        ("ModelDownloading", "not downloaded on node node-1 for this cache (status Model"),
        ("ModelDownloadError", "status ModelDownloadError"),
        (None, "status none"),
    ],
)
def test_a_cache_not_downloaded_for_itself_gets_nothing(status: str | None, why: str) -> None:
    with pytest.raises(entitlement.Refused, match=r"cache team/bert is not downloaded") as info:
        _decide(_attributes(), _node(status))
    assert why in str(info.value)


def test_a_namespace_cache_is_mounted_only_by_pods_of_its_namespace() -> None:
    attributes = _attributes(**{entitlement.POD_NAMESPACE: "other"})
    with pytest.raises(entitlement.Refused, match="only pods of namespace team may"):
        _decide(attributes, _node())


def test_a_cluster_cache_is_open_to_every_namespace() -> None:
    node = _node()
    node["status"]["modelStatus"]["open"] = "ModelDownloaded"
    attributes = _attributes(
        cache="open", **{entitlement.STORAGE_KEY: keys.storage_key("s3://other/x")}
    )
    grant = _decide(attributes, node)
    assert grant.subpath == f"models/{keys.storage_key('s3://other/x')}"


def test_a_volume_whose_key_is_not_its_entrys_is_refused() -> None:
    node = _node()
    node["spec"]["localModels"][0]["sourceModelUri"] = "s3://bucket/other"
    with pytest.raises(entitlement.Refused, match="not the volume's"):
        _decide(_attributes(), node)


def test_a_cache_without_an_entry_on_the_node_is_refused() -> None:
    with pytest.raises(entitlement.Refused, match="has no entry on node node-1"):
        _decide(_attributes(cache="team/gone"), _node())


JOB = f"lmd-{KEY}-0123456789abcdef-0-abcd1234"


def _record(**extra: Any) -> dict[str, Any]:
    """The agent's record of a Job on the models root (`.jobs/<job>.json`)."""
    return {"namespace": "team", "statusKey": "team/bert", "storageKey": KEY, **extra}


def test_a_download_pod_of_a_recorded_job_gets_its_staging_folder_read_write() -> None:
    attributes = _attributes("download", **{entitlement.POD_NAME: f"{JOB}-x7k2p"})
    grant = _decide(attributes, _node(), record=_record())
    assert grant == entitlement.Grant(f".staging/{KEY}-{JOB}", writable=True)


@pytest.mark.parametrize(
    ("pod_name", "record"),
    [
        ("not-a-job-pod", _record()),
        (f"{JOB}-x7k2p-more", _record()),
        (f"{JOB}-x7k2p", None),
        (f"{JOB}-x7k2p", _record(namespace="other")),
        (f"{JOB}-x7k2p", _record(statusKey="team/else")),
        (f"{JOB}-x7k2p", _record(storageKey="0" * 16)),
        ("..-x7k2p", _record()),
    ],
)
def test_any_other_pod_of_a_download_volume_is_refused(pod_name: str, record: Any) -> None:
    attributes = _attributes("download", **{entitlement.POD_NAME: pod_name})
    with pytest.raises(entitlement.Refused, match="is not the pod of a download Job"):
        _decide(attributes, _node(), record=record)


def test_with_copies_of_other_scopes_and_no_progress_in_status_nothing_is_guessed() -> None:
    """KServe's CRD schema drops modelProgress: which copy is this cache's is unknown."""
    node = _node()
    with pytest.raises(entitlement.Refused, match="install localcache's CRDs"):
        _decide(_attributes(), node, variants=(f"{KEY}.00112233aabbccdd",))
    node["status"]["modelProgress"] = {}
    assert _decide(_attributes(), node, variants=(f"{KEY}.00112233aabbccdd",)).source == ""


@pytest.mark.parametrize(
    ("attributes", "why"),
    [
        (_attributes(role="hostPath"), "not a localcache volume"),
        (_attributes(**{entitlement.STORAGE_KEY: "../../etc"}), "not a storage key"),
        (_attributes(**{entitlement.ROOT: "relative"}), "not an absolute path"),
        ({entitlement.ROLE: "serving"}, "is missing"),
    ],
)
def test_volumes_that_are_not_localcaches_are_refused(attributes: dict[str, str], why: str) -> None:
    with pytest.raises(entitlement.Refused, match=why):
        entitlement.Volume.of(attributes)


def test_inline_ephemeral_use_is_refused() -> None:
    with pytest.raises(entitlement.Refused, match="not inline ephemeral"):
        entitlement.Pod.of(_attributes(**{entitlement.EPHEMERAL: "true"}))


def test_an_entry_served_from_its_scopes_own_folder_variant_sees_that_folder() -> None:
    node = _node(modelProgress={"team/bert": {"folder": f"{KEY}.00112233aabbccdd"}})
    grant = _decide(_attributes(), node)
    assert grant.subpath == f"models/{KEY}"
    assert grant.folder == f"models/{KEY}.00112233aabbccdd"


def test_a_folder_of_another_storage_key_is_refused() -> None:
    node = _node(modelProgress={"team/bert": {"folder": "fedcba9876543210.00112233aabbccdd"}})
    with pytest.raises(entitlement.Refused, match="names folder"):
        _decide(_attributes(), node)
