"""The data-plane benchmark's pure parts: sizes, figures over pairs, the table."""

from __future__ import annotations

import pytest

from benchmarks.dataplane import figures
from benchmarks.dataplane.figures import Run

SIZE = 256_000_000


def run(
    mode: figures.Mode,
    nodes: int,
    last: float,
    *,
    pair: int = 1,
    origin: int | None = None,
    link: int = 0,
    agents: float = 1.0,
    downloads: float = 2.0,
) -> Run:
    ready = {f"node-{i}": last - (nodes - i) for i in range(1, nodes + 1)}
    return Run(
        mode=mode,
        nodes=nodes,
        pair=pair,
        ready_s=ready,
        origin_bytes_server=nodes * SIZE if origin is None else origin,
        origin_bytes_link=link,
        cpu_agents_s=agents,
        cpu_downloads_s=downloads,
    )


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("256M", 256_000_000),
        ("256MB", 256_000_000),
        ("1G", 1_000_000_000),
        ("8MiB", 8 * 2**20),
        ("512mi", 512 * 2**20),
        ("4096", 4096),
        ("1.5G", 1_500_000_000),
    ],
)
def test_sizes_read_decimal_and_binary_units(text: str, want: int) -> None:
    assert figures.parse_size(text) == want


@pytest.mark.parametrize("text", ["", "M", "-1M", "0", "12X", "1I"])
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        figures.parse_size(text)


def test_node_counts_are_sorted_distinct_and_positive() -> None:
    assert figures.parse_nodes("4,1,2,2") == [1, 2, 4]
    for bad in ("", "0,1", "a,b"):
        with pytest.raises(ValueError, match="node counts"):
            figures.parse_nodes(bad)


def test_a_run_counts_the_servers_bytes_and_falls_back_to_the_link_class() -> None:
    counted = run("baseline", 2, 60.0, origin=2 * SIZE, link=2 * SIZE + 9)
    assert counted.origin_bytes() == 2 * SIZE
    unknown = run("baseline", 2, 60.0, link=2 * SIZE + 9)
    unknown = Run(**{**unknown.__dict__, "origin_bytes_server": None})
    assert unknown.origin_bytes() == 2 * SIZE + 9
    assert counted.first_s == 59.0
    assert counted.last_s == 60.0


def test_figures_are_medians_over_the_pairs_with_their_spread() -> None:
    runs = [
        run("baseline", 1, 30.0, pair=1),
        run("baseline", 1, 34.0, pair=2),
        run("baseline", 1, 32.0, pair=3),
        run("peer", 1, 33.0, pair=1, origin=SIZE + SIZE // 100),
    ]
    found = figures.summarize(runs, size=SIZE)
    base = found[(1, "baseline")]
    assert base.runs == 3
    assert base.last_s == figures.Spread(32.0, 30.0, 34.0)
    assert base.origin_ratio.median == 1.0
    assert found[(1, "peer")].origin_ratio.median == pytest.approx(1.01)


def test_t1_is_the_one_node_baseline_and_overhead_compares_peer_with_it() -> None:
    found = figures.summarize(
        [run("baseline", 1, 32.0), run("peer", 1, 33.6), run("baseline", 4, 128.0)], size=SIZE
    )
    assert figures.t1(found) == 32.0
    assert figures.overhead_at_one(found) == pytest.approx(0.05)
    assert figures.overhead_at_one(figures.summarize([run("baseline", 1, 3.0)], size=SIZE)) is None


def test_the_table_puts_every_peer_figure_beside_the_baseline() -> None:
    runs = [
        run("baseline", 1, 32.0),
        run("peer", 1, 32.0, origin=SIZE),
        run("baseline", 4, 128.0, agents=4.0, downloads=20.0),
        run("peer", 4, 40.0, origin=SIZE * 21 // 20, agents=6.0, downloads=22.0),
    ]
    text = figures.table(figures.summarize(runs, size=SIZE))
    assert "| 4 | origin bytes ÷ size | 4.00 | 1.05 |" in text
    assert "| 4 | time to last node ready, s | 128.0 | 40.0 |" in text
    assert "| 4 | time to last node ÷ T1 | 4.00 | 1.25 |" in text
    assert "| 4 | CPU s, agents | 4.0 | 6.0 |" in text
    assert "| 4 | CPU s, download pods | 20.0 | 22.0 |" in text
    assert "| 1 | time to last node ÷ T1 | 1.00 | 1.00 |" in text
    assert "T1 (one node alone, from the origin): 32.0 s" in text
    assert "overhead at N = 1 (peer ÷ baseline - 1): +0.0 %" in text


def test_the_table_shows_the_spread_and_what_was_not_measured() -> None:
    runs = [run("baseline", 2, 60.0, pair=1), run("baseline", 2, 70.0, pair=2)]
    text = figures.table(figures.summarize(runs, size=SIZE))
    assert "| 2 | time to last node ready, s | 65.0 (60.0..70.0) | - |" in text
    assert "| 2 | time to last node ÷ T1 | - | - |" in text  # no N = 1 baseline
    assert "not measured (run N = 1)" in text
    assert "overhead at N = 1: not measured" in text


def test_a_run_line_names_the_mode_the_times_and_the_origin_bytes() -> None:
    line = figures.run_line(run("peer", 2, 40.0, link=2 * SIZE), size=SIZE)
    assert "N=2 pair 1 peer" in line
    assert "origin÷size server 2.00 link 2.00" in line
    assert "node-1 39.0s, node-2 40.0s" in line
