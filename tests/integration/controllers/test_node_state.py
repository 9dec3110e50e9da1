"""Issue 13 risk 6: the controller forgets what it kept per node when the Node goes.

`LocalModelNodes` keeps a lock and its last written object per node; for a deleted Node they
used to stay for ever, so a cluster with node churn (autoscaling) grew without bound.
"""

from __future__ import annotations

from localcache.devenv.waiting import wait_until
from tests.integration.controllers.conftest import Env, lists_exactly


async def test_a_deleted_nodes_state_is_forgotten(env: Env) -> None:
    group = env.name("gpu")
    await env.group(group, group)
    stays = await env.node(env.name("stays"), group)
    goes = await env.node(env.name("goes"), group)
    controllers = await env.start()
    name = env.name("iris")
    await env.cache(name, [group])
    for node in (stays, goes):
        await wait_until(lists_exactly(env, node, {("", name)}), what=f"{node} lists {name}")
    writer = controllers.handle.writer
    assert {stays, goes} <= writer.tracked()

    await env.delete_node(goes)
    await wait_until(
        lambda: goes not in writer.tracked(),
        what=f"the controller forgot the state it kept for deleted node {goes}",
    )
    assert stays in writer.tracked()
