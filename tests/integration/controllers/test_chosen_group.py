"""The serving claim follows the node group the webhook chose (issue 21 item 3): the webhook
may pick any of a cache's groups (the one the predictor can run on) and names its claim in
the `localmodel-pvc-name` annotation; the controller creates that group's pair in the
InferenceService's namespace, and moves with the annotation when it changes."""

from __future__ import annotations

import pytest

from localcache.api import inferenceservice
from localcache.caching import names
from localcache.controllers import state
from localcache.devenv.waiting import wait_until
from localcache.runtime import kube
from tests.integration.controllers.conftest import Env, gone, wait_bound_pair

pytestmark = pytest.mark.kcm


async def test_the_claim_named_by_the_isvc_is_the_one_created(env: Env) -> None:
    g1, g2 = env.name("gpu1"), env.name("gpu2")
    await env.group(g1, g1)
    await env.group(g2, g2)
    isvc_ns = await env.namespace_("isvcs")
    await env.start()
    name = env.name("llm")
    await env.cache(name, [g1, g2])
    await env.isvc("svc", isvc_ns, cache=name)  # no claim named yet: KServe's first group
    await wait_bound_pair(
        env,
        pv=names.serving_pv(name, g1, isvc_ns),
        pvc=names.serving_pvc(name, g1),
        namespace=isvc_ns,
        role="serving (first group)",
    )
    chosen = names.serving_pvc(name, g2)
    patch = {
        "metadata": {"annotations": {inferenceservice.LOCAL_MODEL_PVC_NAME_ANNOTATION: chosen}}
    }
    await env.api.patch(state.INFERENCE_SERVICES, "svc", patch, namespace=isvc_ns)
    await wait_bound_pair(
        env,
        pv=names.serving_pv(name, g2, isvc_ns),
        pvc=chosen,
        namespace=isvc_ns,
        role="serving (the chosen second group)",
    )
    first_pv = names.serving_pv(name, g1, isvc_ns)
    await wait_until(
        gone(env, kube.PERSISTENT_VOLUMES, first_pv),
        what=f"serving PV {first_pv} of the first group, which no InferenceService uses, is gone",
    )
