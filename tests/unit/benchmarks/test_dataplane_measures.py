"""The data-plane benchmark's traffic shaping commands, tc counters, CPU split and watch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.dataplane import cpu, shaping, watch

TC_CLASSES = """\
class htb 1:99 root prio 0 rate 10Gbit ceil 10Gbit burst 1250000b cburst 1250000b
 Sent 52214 bytes 301 pkt (dropped 0, overlimits 0 requeues 0)
 backlog 0b 0p requeues 0
class htb 1:10 root prio 0 rate 67108Kbit ceil 67108Kbit burst 167772b cburst 167772b
 Sent 268901234 bytes 4410 pkt (dropped 0, overlimits 120 requeues 0)
 backlog 0b 0p requeues 0
"""


def test_the_origin_is_capped_in_total_by_its_source_port_and_the_rest_is_not() -> None:
    commands = shaping.origin_commands("lcbr0", port=9000, rate=8 * 2**20)
    joined = [" ".join(c) for c in commands]
    assert joined[0] == "tc qdisc replace dev lcbr0 root handle 1: htb default 99"
    assert f"classid 1:10 htb rate {8 * 2**20 * 8}bit ceil {8 * 2**20 * 8}bit" in joined[1]
    assert "classid 1:99 htb rate 10000000000bit" in joined[2]
    assert joined[3].endswith("u32 match ip sport 9000 0xffff flowid 1:10")


def test_a_link_is_capped_whole_with_a_burst_above_one_gso_segment() -> None:
    commands = shaping.link_commands("veth3", rate=40 * 2**20)
    assert commands[0][:5] == ["tc", "qdisc", "replace", "dev", "veth3"]
    assert "default" in commands[0]
    assert commands[0][-1] == "10"
    depth = int(commands[1][commands[1].index("burst") + 1])
    assert depth >= 64 * 1024
    assert shaping.burst(1024) == shaping.MIN_BURST


@pytest.mark.parametrize(("port", "rate"), [(0, 1), (70000, 1), (9000, 0)])
def test_a_cap_that_makes_no_sense_is_refused(port: int, rate: int) -> None:
    with pytest.raises(ValueError, match="bad"):
        shaping.origin_commands("lcbr0", port=port, rate=rate)


def test_apply_runs_each_command_in_order() -> None:
    seen: list[list[str]] = []
    shaping.apply(lambda c: seen.append(list(c)), shaping.link_commands("eth0", rate=1000))
    assert [c[1] for c in seen] == ["qdisc", "class"]


def test_class_bytes_reads_the_sent_counter_of_one_class() -> None:
    assert shaping.class_bytes(TC_CLASSES, "1:10") == 268901234
    assert shaping.class_bytes(TC_CLASSES, "1:99") == 52214
    with pytest.raises(KeyError):
        shaping.class_bytes(TC_CLASSES, "1:11")


def _cgroup(folder: Path, ns: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpuacct.usage").write_text(f"{ns}\n")


def test_cpu_counters_are_read_for_nodes_and_pods_v1_and_v2(tmp_path: Path) -> None:
    node = tmp_path / "node-1"
    agent = "0b7e3f1e-1111-4c1a-9d7b-000000000001"
    _cgroup(node, 10 * 10**9)
    _cgroup(node / "kubepods" / "besteffort" / f"pod{agent}", 3 * 10**9)
    _cgroup(node / "kubepods" / "besteffort" / f"pod{agent}" / "abc", 1)  # a container
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 1\n")
    assert cpu.usage_seconds(v2) == 2.5
    assert cpu.usage_seconds(tmp_path / "none") is None
    found = cpu.snapshot({"node-1": node})
    assert found.nodes == {"node-1": 10.0}
    assert found.pods == {agent: 3.0}


def test_download_pods_are_what_the_node_used_beyond_the_pods_that_stayed() -> None:
    before = cpu.Snapshot(nodes={"n1": 10.0, "n2": 5.0}, pods={"agent1": 2.0, "ctl": 1.0})
    after = cpu.Snapshot(
        nodes={"n1": 20.0, "n2": 9.0},
        pods={"agent1": 4.0, "ctl": 1.5, "job-pod": 6.0},  # the Job's pod started meanwhile
    )
    agents, downloads = cpu.split(before, after, agents={"agent1"})
    assert agents == 2.0
    assert downloads == pytest.approx(14.0 - 2.5)


def test_a_json_stream_yields_each_object_once_complete() -> None:
    stream = watch.JsonStream()
    one = json.dumps({"metadata": {"name": "node-1"}}, indent=2)
    two = json.dumps({"metadata": {"name": "node-2"}})
    assert stream.feed(one[:10]) == []
    assert stream.feed(one[10:] + "\n" + two[:5]) == [{"metadata": {"name": "node-1"}}]
    assert stream.feed(two[5:] + "\n") == [{"metadata": {"name": "node-2"}}]


def test_a_node_is_ready_when_its_status_reports_the_key_downloaded() -> None:
    node = {"status": {"modelStatus": {"bench/m": "ModelDownloaded", "x": "ModelDownloading"}}}
    assert watch.downloaded(node, "bench/m")
    assert not watch.downloaded(node, "x")
    assert not watch.downloaded({"status": None}, "bench/m")


def test_a_listing_counts_as_its_items() -> None:
    listed = {"kind": "List", "items": [{"metadata": {"name": "node-1"}}]}
    assert watch.listed_items([listed, {"kind": "LocalModelNode"}, 3]) == [
        {"metadata": {"name": "node-1"}},
        {"kind": "LocalModelNode"},
    ]
