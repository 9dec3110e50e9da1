"""Derived PV/PVC names: KServe's form when unambiguous and short, otherwise hash-shortened;
always valid, never shared by two derivations of the same object space."""

from __future__ import annotations

import itertools
import re

import pytest

from localcache.caching import names
from localcache.runtime import events

SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def valid(name: str) -> bool:
    return len(name) <= names.MAX_NAME and SUBDOMAIN.fullmatch(name) is not None


def pv_names(caches: list[str], groups: list[str], namespaces: list[str]) -> list[tuple[str, str]]:
    """(derivation, name) of every PV the controller may create for these inputs."""
    out = []
    for c, g in itertools.product(caches, groups):
        out.append((f"cluster-download {c} {g}", names.download_pv(c, g, None)))
        for ns in namespaces:
            out.append((f"namespace-download {c} {g} {ns}", names.download_pv(c, g, ns)))
            out.append((f"serving {c} {g} {ns}", names.serving_pv(c, g, ns)))
            legacy = names.legacy_serving_pv(c, g, ns)
            if legacy != names.serving_pv(c, g, ns):  # both live during a migration
                out.append((f"legacy-serving {c} {g} {ns}", legacy))
    return out


def pvc_names(caches: list[str], groups: list[str]) -> list[tuple[str, str]]:
    """(derivation, name) of every PVC with a hash-guarded name that may live in one
    namespace: serving PVCs as named before issue 21 and the download PVCs of both kinds
    (jobNamespace may also hold namespace caches). Today's serving PVC is KServe's plain join,
    whose ambiguity the controller reports at plan time (`VolumeNameTaken`)."""
    out = []
    for c, g in itertools.product(caches, groups):
        serving = names.legacy_serving_pvc(c, g)
        cluster_download = names.download_pvc(c, g, namespaced=False)
        if serving == cluster_download:  # KServe's `{cache}-{group}` for both roles
            out.append((f"pair {c} {g}", serving))
        else:
            out.append((f"serving {c} {g}", serving))
            out.append((f"cluster-download {c} {g}", cluster_download))
        out.append((f"namespace-download {c} {g}", names.download_pvc(c, g, namespaced=True)))
    return out


def assert_distinct(derived: list[tuple[str, str]]) -> None:
    seen: dict[str, str] = {}
    for what, name in derived:
        assert valid(name), f"{what} -> invalid {name!r}"
        assert seen.setdefault(name, what) == what, f"{what} and {seen[name]} are both {name}"


def test_single_word_names_keep_kserves_forms() -> None:
    assert names.serving_pvc("iris", "gpu1") == "iris-gpu1"
    assert names.download_pvc("iris", "gpu1", namespaced=False) == "iris-gpu1"
    assert names.download_pvc("iris", "gpu1", namespaced=True) == "iris-gpu1-download"
    assert names.download_pv("iris", "gpu1", None) == "iris-gpu1-download"
    assert names.download_pv("iris", "gpu1", "team") == "iris-gpu1-team-download"
    assert names.serving_pv("iris", "gpu1", "prod") == "iris-gpu1-prod"


def test_a_dashed_cache_name_keeps_kserves_serving_pvc_name() -> None:
    """The name KServe's defaulter puts in `localmodel-pvc-name` for the usual case."""
    assert names.serving_pvc("qwen-model", "gpu1") == "qwen-model-gpu1"
    assert names.download_pvc("qwen-model", "gpu1", namespaced=True) == "qwen-model-gpu1-download"
    assert names.serving_pv("qwen-model", "gpu1", "prod") == "qwen-model-gpu1-prod"


def test_a_dash_moved_between_cache_and_group_gives_different_names() -> None:
    """`a-b`+`c` and `a`+`b-c` were both `a-b-c`: the old serving PVC names told them apart;
    the PVs still do."""
    assert names.legacy_serving_pvc("a-b", "c") != names.legacy_serving_pvc("a", "b-c")
    assert names.legacy_serving_pvc("a-b", "c") == "a-b-c"
    assert names.legacy_serving_pvc("a", "b-c").startswith("a-b-c--")
    assert names.serving_pv("a", "b-c", "ns") != names.serving_pv("a", "b", "c-ns")
    assert names.serving_pv("a", "b-c", "ns") != names.serving_pv("a-b", "c", "ns")


def test_the_serving_pvc_is_kserves_plain_join_wherever_it_is_a_valid_name() -> None:
    """What KServe's LLMInferenceService controller recomputes for a LoRA adapter."""
    for cache, group in [("a", "b-c"), ("a-b", "c"), ("m", "download"), ("x", "gpu-a100")]:
        assert names.serving_pvc(cache, group) == f"{cache}-{group}"
        assert names.serving_pvc(cache, group) == names.plain_serving_pvc(cache, group)


def test_the_plain_claims_pv_differs_from_the_old_one_only_where_the_claim_name_changed() -> None:
    assert names.serving_pv("iris", "gpu1", "prod") == "iris-gpu1-prod"
    assert names.legacy_serving_pv("iris", "gpu1", "prod") == "iris-gpu1-prod"
    moved = names.serving_pv("llama", "gpu-a100", "prod")
    assert moved != names.legacy_serving_pv("llama", "gpu-a100", "prod")
    assert names.MARK in moved
    assert valid(moved)


def test_a_plain_join_over_253_characters_is_shortened() -> None:
    cache, group = "m" * 200, "g" * 60
    assert names.plain_serving_pvc(cache, group) == f"{cache}-{group}"
    shortened = names.serving_pvc(cache, group)
    assert valid(shortened)
    assert shortened != names.plain_serving_pvc(cache, group)
    assert shortened == names.legacy_serving_pvc(cache, group)


def test_cluster_and_namespace_download_pvs_do_not_collide() -> None:
    """Cluster cache `llama-cpu` on `gpu` vs namespace cache `llama` on `cpu` in `gpu`."""
    cluster = names.download_pv("llama-cpu", "gpu", None)
    namespaced = names.download_pv("llama", "cpu", "gpu")
    assert namespaced == "llama-cpu-gpu-download"
    assert cluster != namespaced
    assert valid(cluster)


def test_a_namespace_named_download_does_not_take_a_download_pv_name() -> None:
    assert names.serving_pv("m", "g", "download") != names.download_pv("m", "g", None)
    assert names.serving_pvc("m", "download") != names.download_pvc("m", "g", namespaced=True)


WORDS = ["a", "b", "a-b", "b-a", "a-b-a", "download", "a-download", "a--b", "a.b", "b.a-b"]


@pytest.mark.parametrize("size", [1, 2])
def test_no_two_derivations_share_a_name(size: int) -> None:
    parts = ["-".join(p) for p in itertools.product(["a", "b", "download"], repeat=size)]
    pool = sorted({*WORDS, *parts})
    assert_distinct(pv_names(pool, pool, [w for w in pool if "." not in w]))
    assert_distinct(pvc_names(pool, pool))


def test_long_names_are_shortened_deterministically_and_stay_valid() -> None:
    cache, ns = "m" * 240, "n" * 63
    derived = [
        names.serving_pvc(cache, "gpu"),
        names.download_pvc(cache, "gpu", namespaced=True),
        names.download_pv(cache, "gpu", ns),
        names.serving_pv(cache, "gpu", ns),
    ]
    for name in derived:
        assert valid(name), name
        assert name.startswith("m" * 200)
    assert len(set(derived)) == len(derived)
    assert names.serving_pv(cache, "gpu", ns) == names.serving_pv(cache, "gpu", ns)
    assert names.serving_pv(cache, "gpu", ns) != names.serving_pv(cache, "gpu", "n" * 62)


def test_a_name_at_the_limit_keeps_kserves_form() -> None:
    cache = "m" * (names.MAX_NAME - len("-gpu"))
    assert names.serving_pvc(cache, "gpu") == f"{cache}-gpu"
    assert names.serving_pvc(cache + "m", "gpu") != f"{cache}m-gpu"


def test_a_shortened_prefix_never_ends_in_a_dot_or_dash() -> None:
    cache = "a." * 120 + "b"
    name = names.download_pv(cache, "gpu", "team")
    assert valid(name), name


def test_event_names_of_long_cache_names_keep_client_gos_form_and_fit() -> None:
    assert events.event_name("iris", "0123456789abcdef") == "iris.0123456789abcdef"
    long = events.event_name("m" * 253, "0123456789abcdef")
    assert valid(long)
    assert long.endswith(".0123456789abcdef")
