"""KServe's LLMInferenceService CRD installed after the controller started: the controller and
the webhooks begin watching the kind (no restart), list its users in
`status.llmInferenceServices` (empty while the kind is absent) and refuse deleting a cache
they use. (This module's node group has no valid claim spec, so claims are tested on the
session plane, tests/integration/controllers/test_llm_users.py.)

Runs on this module's own control plane (`private_plane`): installing KServe's stand-in CRD
on the session's would change what other tests see.
"""

from __future__ import annotations

import asyncio

from localcache.api import groupversion
from localcache.api import inferenceservice as isvc_api
from localcache.devenv import crds as crd_install
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime.crds import optional
from localcache.runtime.keys import ObjectKey
from tests.integration.anyorder.conftest import KSERVE_CRDS
from tests.integration.anyorder.test_start_in_any_order import availability, controller_process
from tests.integration.webhooks.test_llm_delete_guard import llm_obj

LLM_CRD = KSERVE_CRDS / "llminferenceservice-crd.yaml"
LLM = groupversion.LLM_INFERENCE_SERVICE
LMC = groupversion.LOCAL_MODEL_CACHE


async def test_llm_users_are_served_once_their_crd_appears_after_start(
    private_plane: ControlPlane,
) -> None:
    async with controller_process(private_plane) as process:
        llms = process.controllers.llm_inference_services
        assert llms is not None
        assert llms is process.hooks.llm_inference_services, "one shared optional informer"
        assert llms.availability is optional.Availability.ABSENT
        harness = process.harness
        group = await harness.node_group()
        name = harness.name("llama")
        await harness.client.create(LMC.api, harness.cache_obj(name, "gs://b/base", groups=[group]))

        async def reconciled() -> bool:
            cache = await harness.get(LMC.api, name)
            return not (cache.get("status") or {}).get("llmInferenceServices", [None])

        await wait_until(reconciled, timeout=30, what=f"cache {name} reconciled without the CRD")

        await asyncio.to_thread(crd_install.install_crds, private_plane, [LLM_CRD])
        await availability(
            llms, optional.Availability.SYNCED, what="LLMInferenceServices watched after the CRD"
        )
        ns = harness.namespace
        labels = {isvc_api.LOCAL_MODEL_LABEL: name}
        await harness.client.create(LLM.api, llm_obj("chat", labels=labels), namespace=ns)

        async def listed() -> bool:
            cache = await harness.get(LMC.api, name)
            found = (cache.get("status") or {}).get("llmInferenceServices")
            return found == [{"namespace": ns, "name": "chat"}]

        await wait_until(listed, timeout=30, what=f"cache {name} lists LLMInferenceService chat")

        await harness.seen(llms, ObjectKey(ns, "chat"))
        async with harness.validating():
            refused = await harness.kubectl("delete", LMC.crd_name, name)
        assert refused.returncode != 0
        assert f"LLMInferenceService {ns}/chat (base model)" in refused.stderr
        process.alive()
