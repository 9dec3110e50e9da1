"""LLMInferenceServices (KServe's stand-in CRD, v1alpha1 and v1alpha2) as cache users on the real
control plane: serving claims in their namespaces (base model or LoRA adapter, under KServe's
plain `<cache>-<group>`), `status.llmInferenceServices`, cleanup when the last user goes, the
plain-name clash reported instead of shared, and old hash-named claims kept while named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localcache.api import groupversion, inferenceservice
from localcache.caching import llmuse, names
from localcache.controllers import state
from localcache.devenv.waiting import wait_until
from localcache.runtime import kube
from tests.integration.controllers.conftest import URI, Env, exists, gone, wait_bound_pair

pytestmark = pytest.mark.kcm

Obj = dict[str, Any]
LLM = groupversion.LLM_INFERENCE_SERVICE
V1ALPHA1 = kube.Resource(LLM.group, "v1alpha1", LLM.plural, LLM.kind, namespaced=True)
V1ALPHA2 = state.LLM_INFERENCE_SERVICES
ADAPTER_URI = "s3://mybucket/adapters/colorist"


async def _llm(
    env: Env,
    name: str,
    namespace: str,
    *,
    res: kube.Resource = V1ALPHA2,
    cache: str | None = None,
    lora_cache: str | None = None,
    uri: str = "s3://mybucket/other-base",
) -> Obj:
    """An LLMInferenceService of model `uri` (and adapter `ADAPTER_URI`), labelled for
    `cache` and annotated for `lora_cache` as KServe's and localcache's webhooks would."""
    labels = {inferenceservice.LOCAL_MODEL_LABEL: cache} if cache else {}
    annotations = {}
    if lora_cache:
        annotations[llmuse.LORA_ANNOTATION] = json.dumps({"colorist": {"cache": lora_cache}})
    body = {
        "apiVersion": f"{res.group}/{res.version}",
        "kind": LLM.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "model": {
                "uri": uri,
                "name": "base",
                "lora": {"adapters": [{"name": "colorist", "uri": ADAPTER_URI}]},
            }
        },
    }
    return await env.api.create(res, body, namespace=namespace)


async def _group(env: Env) -> str:
    group = env.name("gpu")  # `gpu-<suffix>`: a dash, hash-named before issue 21
    await env.group(group, group)
    await env.node(env.name("node"), group)
    return group


async def test_llm_users_of_both_versions_get_claims_and_are_listed_until_they_go(
    env: Env,
) -> None:
    group = await _group(env)
    ns_a, ns_b = await env.namespace_("llm-a"), await env.namespace_("llm-b")
    await env.start()
    name = env.name("llama")
    await env.cache(name, [group])
    await _llm(env, "chat", ns_a, res=V1ALPHA2, cache=name, uri=URI)
    await _llm(env, "legacy-api", ns_b, res=V1ALPHA1, cache=name, uri=f"{URI}/sub")
    claim = names.serving_pvc(name, group)
    assert claim == f"{name}-{group}", "KServe's plain name"
    for ns in (ns_a, ns_b):
        await wait_bound_pair(
            env, pv=names.serving_pv(name, group, ns), pvc=claim, namespace=ns, role="serving"
        )
    await env.wait_status(
        name,
        llmInferenceServices=[
            {"namespace": ns_a, "name": "chat"},
            {"namespace": ns_b, "name": "legacy-api"},
        ],
        what="the cache lists both LLMInferenceServices",
    )
    assert (await env.cache_status(name)).get("inferenceServices") == []

    await env.api.delete(V1ALPHA2, "legacy-api", namespace=ns_b)
    await wait_until(
        gone(env, kube.PERSISTENT_VOLUME_CLAIMS, claim, ns_b),
        what=f"the serving claim in {ns_b} is removed with its last user",
    )
    await env.wait_status(
        name,
        llmInferenceServices=[{"namespace": ns_a, "name": "chat"}],
        what="the cache no longer lists the deleted LLMInferenceService",
    )
    assert await env.get(kube.PERSISTENT_VOLUME_CLAIMS, claim, ns_a) is not None


async def test_a_lora_adapter_gets_kserves_plain_claim_name_in_its_namespace(env: Env) -> None:
    group = await _group(env)
    ns = await env.namespace_("lora")
    await env.start()
    adapters = env.name("colorist")
    await env.cache(adapters, [group], uri=ADAPTER_URI)
    forged = env.name("forged")
    await env.cache(forged, [group], uri="s3://mybucket/secret")
    await _llm(env, "tuned", ns, lora_cache=adapters)
    await _llm(env, "thief", ns, lora_cache=forged)  # no adapter of that URI
    claim = f"{adapters}-{group}"  # what KServe's controller recomputes (#5690)
    await wait_bound_pair(
        env, pv=names.serving_pv(adapters, group, ns), pvc=claim, namespace=ns, role="serving"
    )
    await env.wait_status(
        adapters,
        llmInferenceServices=[{"namespace": ns, "name": "tuned"}],
        what="the adapter cache lists the LoRA user",
    )
    await env.wait_status(
        forged, llmInferenceServices=[], what="an annotation without the adapter's URI is no use"
    )
    assert await env.get(kube.PERSISTENT_VOLUME_CLAIMS, f"{forged}-{group}", ns) is None

    await env.api.delete(V1ALPHA2, "tuned", namespace=ns)
    await wait_until(
        gone(env, kube.PERSISTENT_VOLUME_CLAIMS, claim, ns),
        what="the LoRA claim is removed with its user",
    )
    await env.wait_status(adapters, llmInferenceServices=[], what="the LoRA user is unlisted")


async def test_two_caches_whose_plain_claim_names_clash_do_not_share_a_claim(env: Env) -> None:
    """Cache `m` on group `g-s` and cache `m-g` on group `s` both give `m-g-s`."""
    s = env.suffix
    first_group, second_group = f"g-s{s}", f"s{s}"
    for group in (first_group, second_group):
        await env.group(group, group)
    ns = await env.namespace_("clash")
    await env.start()
    first, second = f"m{s}", f"m{s}-g"
    await env.cache(first, [first_group], uri="s3://mybucket/first")
    await _llm(env, "one", ns, cache=first, uri="s3://mybucket/first")
    clash = names.serving_pvc(first, first_group)
    assert clash == names.serving_pvc(second, second_group) == f"m{s}-g-s{s}"
    await wait_until(
        exists(env, kube.PERSISTENT_VOLUME_CLAIMS, clash, ns), what=f"claim {clash} exists"
    )
    await env.cache(second, [second_group], uri="s3://mybucket/second")
    await _llm(env, "two", ns, cache=second, uri="s3://mybucket/second")

    async def reported() -> bool:
        conds = (await env.cache_status(second)).get("conditions") or []
        degraded: Obj = next((c for c in conds if c["type"] == "Degraded"), {})
        return degraded.get("reason") == "VolumeNameTaken" and clash in degraded.get("message", "")

    await wait_until(reported, what=f"cache {second} is Degraded: {clash} is taken")
    claim = await env.get(kube.PERSISTENT_VOLUME_CLAIMS, clash, ns)
    assert claim is not None
    owner = claim["metadata"]["annotations"][state.OWNER_ANNOTATION]
    assert owner == f"LocalModelCache/{first}", "the first cache keeps its claim"
    assert (
        await env.get(kube.PERSISTENT_VOLUMES, names.serving_pv(second, second_group, ns)) is None
    )


async def test_an_old_hash_named_claim_stays_while_a_user_names_it(env: Env) -> None:
    """Migration: a user admitted by an earlier localcache names the hash-shortened claim;
    both claims exist until it is re-admitted with the plain name, then the old one goes."""
    group = await _group(env)
    ns = await env.namespace_("migrate")
    await env.start()
    name = env.name("iris")
    await env.cache(name, [group])
    old_claim, plain = names.legacy_serving_pvc(name, group), names.serving_pvc(name, group)
    assert old_claim != plain
    isvc = await env.isvc("old", ns, cache=name)
    await env.api.patch(
        state.INFERENCE_SERVICES,
        "old",
        {
            "metadata": {
                "annotations": {inferenceservice.LOCAL_MODEL_PVC_NAME_ANNOTATION: old_claim}
            }
        },
        namespace=ns,
    )
    assert isvc["metadata"]["name"] == "old"
    old_pv = names.legacy_serving_pv(name, group, ns)
    await wait_bound_pair(env, pv=old_pv, pvc=old_claim, namespace=ns, role="old serving")
    await wait_bound_pair(
        env, pv=names.serving_pv(name, group, ns), pvc=plain, namespace=ns, role="serving"
    )
    assert old_pv != names.serving_pv(name, group, ns)

    await env.api.patch(
        state.INFERENCE_SERVICES,
        "old",
        {"metadata": {"annotations": {inferenceservice.LOCAL_MODEL_PVC_NAME_ANNOTATION: plain}}},
        namespace=ns,
    )
    await wait_until(
        gone(env, kube.PERSISTENT_VOLUME_CLAIMS, old_claim, ns),
        what=f"the old claim {old_claim} is deleted once no user names it",
    )
    await wait_until(gone(env, kube.PERSISTENT_VOLUMES, old_pv), what=f"old PV {old_pv} goes")
    assert await env.get(kube.PERSISTENT_VOLUME_CLAIMS, plain, ns) is not None
