"""groupversion: the names every watch and REST call uses."""

from __future__ import annotations

import pytest

from localcache.api import groupversion


def test_group_and_version_are_kserves() -> None:
    assert groupversion.API_VERSION == "serving.kserve.io/v1alpha1"
    assert groupversion.INFERENCE_SERVICE.api_version == "serving.kserve.io/v1beta1"
    assert groupversion.CLUSTER_STORAGE_CONTAINER.api_version == "serving.kserve.io/v1alpha1"


def test_rest_paths_follow_scope() -> None:
    lmc = groupversion.LOCAL_MODEL_CACHE
    lmnc = groupversion.LOCAL_MODEL_NAMESPACE_CACHE
    assert lmc.path() == "/apis/serving.kserve.io/v1alpha1/localmodelcaches"
    assert lmc.path(name="iris") == "/apis/serving.kserve.io/v1alpha1/localmodelcaches/iris"
    assert lmnc.path() == "/apis/serving.kserve.io/v1alpha1/localmodelnamespacecaches"
    assert (
        lmnc.path(namespace="ns", name="m")
        == "/apis/serving.kserve.io/v1alpha1/namespaces/ns/localmodelnamespacecaches/m"
    )
    assert groupversion.INFERENCE_SERVICE.path(namespace="ns") == (
        "/apis/serving.kserve.io/v1beta1/namespaces/ns/inferenceservices"
    )
    with pytest.raises(ValueError, match="cluster-scoped"):
        lmc.path(namespace="ns")


def test_names_are_consistent() -> None:
    for info in groupversion.ALL_KINDS:
        assert info.plural == info.kind.lower() + "s"
        assert info.singular == info.kind.lower()
        assert info.list_kind == info.kind + "List"
        assert info.crd_name == f"{info.plural}.serving.kserve.io"
        assert groupversion.by_kind(info.kind) is info
    with pytest.raises(KeyError):
        groupversion.by_kind("Pod")


def test_own_kinds_share_the_localmodel_category() -> None:
    for info in groupversion.OWN_KINDS:
        assert info.categories == ("localmodel",)
        assert info.version == "v1alpha1"
