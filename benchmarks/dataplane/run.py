"""One benchmark run, and the whole sequence of them (see `benchmarks.dataplane`).

`measure` times one download of the model onto the group's nodes in one mode: it sets the
group's `spec.peerDistribution.enabled`, reads the counters (origin bytes at the server and on
its link class, CPU of every pod cgroup), starts a `watch.ReadyWatch`, creates the cache
(t0), waits until every node reports it downloaded (each node's ti), reads the counters again,
checks every node's disk holds the model's files at their sizes, then deletes the cache and
waits until no node lists it or holds its folder (so the next run starts from empty disks).

`sequence` runs, for each node count N, `pairs` pairs (baseline, then peer) on a node group
of the first N nodes, printing each run's line as it finishes; it returns every `Run`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchmarks.dataplane import bed as bed_mod
from benchmarks.dataplane import cpu, figures, watch
from localcache.api import groupversion
from localcache.caching import keys
from localcache.devenv import waiting

GONE_TIMEOUT_S = 240.0
READY_SLACK_S = 240.0  # start-up of the Jobs' pods, on a busy two-core machine
NAMESPACE = "bench"
CACHE = groupversion.LOCAL_MODEL_NAMESPACE_CACHE
NODE = groupversion.LOCAL_MODEL_NODE


@dataclass(frozen=True)
class Model:
    uri: str
    files: int
    size: int

    @property
    def storage_key(self) -> str:
        return keys.storage_key(self.uri)


def ready_timeout(model: Model, nodes: int, origin_rate: int) -> float:
    """Every node from the origin takes N·S/O; three times that, plus start-up slack."""
    return 3 * nodes * model.size / origin_rate + READY_SLACK_S


def measure(
    bench: bed_mod.BenchBed,
    *,
    model: Model,
    group: str,
    members: Sequence[str],
    mode: figures.Mode,
    pair: int,
) -> figures.Run:
    bench.set_peer(group, mode == "peer")
    name = f"m-{len(members)}-{pair}-{mode}-{uuid.uuid4().hex[:4]}"
    status_key = keys.status_key(name, NAMESPACE)
    agents = bench.agent_uids()
    folders = bench.cpu_folders()
    cpu_before = cpu.snapshot(folders)
    link_before, server_before = bench.origin_link_bytes(), bench.origin_server_bytes()
    ready = watch.ReadyWatch(
        [bench.kubectl_bin, f"--kubeconfig={bench.kubeconfig}"],
        status_key=status_key,
        nodes=members,
        env=bench.kubectl_env,
    ).start()
    try:
        t0 = time.monotonic()
        bench.apply(
            bed_mod.namespace_cache(
                name, model.uri, namespace=NAMESPACE, group=group, size=model.size
            )
        )
        times = ready.wait(ready_timeout(model, len(members), bench.shape.origin_rate))
    finally:
        ready.stop()
    cpu_after = cpu.snapshot(folders)
    link_after, server_after = bench.origin_link_bytes(), bench.origin_server_bytes()
    _check_disks(bench, model, members)
    agent_s, download_s = cpu.split(cpu_before, cpu_after, agents=agents)
    server = None if server_before is None or server_after is None else server_after - server_before
    _delete(bench, name, status_key, model, members)
    return figures.Run(
        mode=mode,
        nodes=len(members),
        pair=pair,
        ready_s={node: at - t0 for node, at in times.items()},
        origin_bytes_server=server,
        origin_bytes_link=link_after - link_before,
        cpu_agents_s=agent_s,
        cpu_downloads_s=download_s,
    )


def _check_disks(bench: bed_mod.BenchBed, model: Model, members: Sequence[str]) -> None:
    """Every node holds `model.files` files of `model.size` bytes in all."""
    for node in members:
        found = bench.model_files(node, model.storage_key)
        if len(found) != model.files or sum(found.values()) != model.size:
            raise RuntimeError(
                f"{node} reported the model downloaded but holds {len(found)} files, "
                f"{sum(found.values())} bytes (want {model.files}, {model.size}): {found}"
            )


def _delete(
    bench: bed_mod.BenchBed, name: str, status_key: str, model: Model, members: Sequence[str]
) -> None:
    bench.kubectl("delete", CACHE.plural, name, "-n", NAMESPACE, "--wait=false")

    def gone() -> bool:
        for node in members:
            lmn = bench.kubectl("get", NODE.plural, node, "-o", "json", check=False)
            assert status_key not in lmn.stdout, f"{node} still lists {status_key}"
            assert not bench.model_files(node, model.storage_key), f"{node} still holds it"
        return True

    waiting.wait_until_sync(
        gone, timeout=GONE_TIMEOUT_S, interval=1.0,
        what=f"every node dropped cache {name} and deleted its folder",
    )  # fmt: skip


def sequence(
    bench: bed_mod.BenchBed,
    *,
    model: Model,
    node_counts: Sequence[int],
    pairs: int,
    say: Callable[[str], None],
) -> list[figures.Run]:
    runs: list[figures.Run] = []
    names = bench.node_names
    for count in node_counts:
        members = names[:count]
        group = f"bench-{count}"
        bench.set_members(members)
        bench.apply(bed_mod.node_group(group, peer=False))
        for pair in range(1, pairs + 1):
            for mode in figures.MODES:
                run = measure(
                    bench, model=model, group=group, members=members, mode=mode, pair=pair
                )
                runs.append(run)
                say(figures.run_line(run, size=model.size))
        bench.kubectl("delete", groupversion.LOCAL_MODEL_NODE_GROUP.plural, group, "--wait=false")
    return runs
