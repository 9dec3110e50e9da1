"""The data-plane benchmark's figures and table: pure, so they are unit-tested.

A `Run` is one measured download of the model onto N nodes in one mode ("baseline": every
node from the origin, today's behaviour and KServe's; "peer": the node group's
`spec.peerDistribution.enabled: true`). `summarize` turns the runs into one `Figures` per
(nodes, mode), each the median over the pairs run (with min and max):

- origin bytes ÷ model size (the origin server's count of body bytes when it has one, else
  the bytes its capped link class sent);
- time to the last node ready (seconds from the cache's creation to the last node's
  `ModelDownloaded`), and that ÷ T1, where T1 is the N = 1 baseline's median;
- CPU seconds of the agents and of the download pods.

`table` prints every figure of the peer mode beside the baseline measured in the same run,
and the overhead at N = 1 (peer's time ÷ baseline's time - 1). `parse_size` and
`parse_nodes` read the command line's sizes ("256M", "1G", "8MiB") and node counts ("1,2,4").
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Mode = Literal["baseline", "peer"]
MODES: tuple[Mode, ...] = ("baseline", "peer")
_UNITS = {"": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "KI": 1024, "MI": 1024**2, "GI": 1024**3}
_SIZE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[KMG]?I?)B?$")


def parse_size(text: str) -> int:
    """Bytes of "256M" / "256MB" (10^6), "256Mi" / "256MiB" (2^20), "1G", "4096"."""
    match = _SIZE.match(text.strip().upper())
    if match is None or match["unit"] == "I":
        raise ValueError(f"not a size: {text!r} (e.g. 256M, 1G, 8MiB)")
    value = int(float(match["n"]) * _UNITS[match["unit"]])
    if value <= 0:
        raise ValueError(f"not a positive size: {text!r}")
    return value


def parse_nodes(text: str) -> list[int]:
    """Sorted distinct node counts of "1,2,4"; each at least 1."""
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"not a list of node counts: {text!r} (e.g. 1,2,4)") from None
    if not counts or counts[0] < 1:
        raise ValueError(f"node counts must be at least 1: {text!r}")
    return counts


@dataclass(frozen=True)
class Run:
    """One measured download: what the harness saw, in seconds and bytes."""

    mode: Mode
    nodes: int
    pair: int
    ready_s: Mapping[str, float]  # node name -> seconds from the cache's creation to ready
    origin_bytes_server: int | None  # body bytes the origin served; None if it cannot say
    origin_bytes_link: int  # bytes the origin's capped link class sent (headers included)
    cpu_agents_s: float
    cpu_downloads_s: float

    @property
    def last_s(self) -> float:
        return max(self.ready_s.values())

    @property
    def first_s(self) -> float:
        return min(self.ready_s.values())

    def origin_bytes(self) -> int:
        if self.origin_bytes_server is not None:
            return self.origin_bytes_server
        return self.origin_bytes_link


@dataclass(frozen=True)
class Spread:
    """Median, min and max of a figure over the pairs."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        found = list(values)
        if not found:
            raise ValueError("no values")
        return cls(statistics.median(found), min(found), max(found))

    def scaled(self, by: float) -> Spread:
        return Spread(self.median / by, self.low / by, self.high / by)


@dataclass(frozen=True)
class Figures:
    """The figures of one (nodes, mode) over its pairs."""

    nodes: int
    mode: Mode
    runs: int
    origin_ratio: Spread  # origin bytes ÷ model size
    last_s: Spread
    cpu_agents_s: Spread
    cpu_downloads_s: Spread


def summarize(runs: Sequence[Run], *, size: int) -> dict[tuple[int, Mode], Figures]:
    """One `Figures` per (nodes, mode) present in `runs`."""
    if size <= 0:
        raise ValueError("the model size must be positive")
    grouped: dict[tuple[int, Mode], list[Run]] = {}
    for run in runs:
        grouped.setdefault((run.nodes, run.mode), []).append(run)
    return {
        key: Figures(
            nodes=key[0],
            mode=key[1],
            runs=len(found),
            origin_ratio=Spread.of(r.origin_bytes() / size for r in found),
            last_s=Spread.of(r.last_s for r in found),
            cpu_agents_s=Spread.of(r.cpu_agents_s for r in found),
            cpu_downloads_s=Spread.of(r.cpu_downloads_s for r in found),
        )
        for key, found in sorted(grouped.items())
    }


def t1(figures: Mapping[tuple[int, Mode], Figures]) -> float | None:
    """T1: the median time of one node alone, from the origin (the N = 1 baseline)."""
    alone = figures.get((1, "baseline"))
    return alone.last_s.median if alone is not None else None


def overhead_at_one(figures: Mapping[tuple[int, Mode], Figures]) -> float | None:
    """Peer time ÷ baseline time - 1 at N = 1 (medians); None without both."""
    base, peer = figures.get((1, "baseline")), figures.get((1, "peer"))
    if base is None or peer is None or base.last_s.median <= 0:
        return None
    return peer.last_s.median / base.last_s.median - 1


def _cell(spread: Spread | None, fmt: str) -> str:
    if spread is None:
        return "-"
    text = format(spread.median, fmt)
    if spread.low != spread.high:
        text += f" ({format(spread.low, fmt)}..{format(spread.high, fmt)})"
    return text


def _row(
    nodes: int,
    name: str,
    pair: tuple[Figures | None, Figures | None],
    pick: str,
    fmt: str,
    *,
    per: float | Literal[False] | None = False,
) -> str:
    """One table row: `pick` of the baseline and of the peer mode; with `per`, divided by it
    ("-" when `per` is None: the reference was not measured)."""
    cells = []
    for found in pair:
        spread: Spread | None = getattr(found, pick) if found is not None else None
        if per is not False and spread is not None:
            spread = spread.scaled(per) if per else None
        cells.append(_cell(spread, fmt))
    return f"| {nodes} | {name} | {cells[0]} | {cells[1]} |"


def table(figures: Mapping[tuple[int, Mode], Figures]) -> str:
    """A Markdown table: per node count, every figure of the baseline and of the peer mode,
    medians over the pairs with (min..max) when they differ; then the overhead at N = 1."""
    reference = t1(figures)
    lines = [
        "| nodes | figure | baseline (every node from the origin) | peer distribution |",
        "|---|---|---|---|",
    ]
    for nodes in sorted({key[0] for key in figures}):
        pair = (figures.get((nodes, "baseline")), figures.get((nodes, "peer")))
        lines += [
            _row(nodes, "origin bytes ÷ size", pair, "origin_ratio", ".2f"),
            _row(nodes, "time to last node ready, s", pair, "last_s", ".1f"),
            _row(nodes, "time to last node ÷ T1", pair, "last_s", ".2f", per=reference),
            _row(nodes, "CPU s, agents", pair, "cpu_agents_s", ".1f"),
            _row(nodes, "CPU s, download pods", pair, "cpu_downloads_s", ".1f"),
        ]
    over = overhead_at_one(figures)
    lines.append("")
    lines.append(
        f"T1 (one node alone, from the origin): {reference:.1f} s"
        if reference
        else "T1 (one node alone, from the origin): not measured (run N = 1)"
    )
    lines.append(
        f"overhead at N = 1 (peer ÷ baseline - 1): {over * 100:+.1f} %"
        if over is not None
        else "overhead at N = 1: not measured"
    )
    return "\n".join(lines)


def run_line(run: Run, *, size: int) -> str:
    """One line per measured run, printed as it finishes."""
    ready = ", ".join(f"{name} {secs:.1f}s" for name, secs in sorted(run.ready_s.items()))
    server = "n/a" if run.origin_bytes_server is None else f"{run.origin_bytes_server / size:.2f}"
    return (
        f"N={run.nodes} pair {run.pair} {run.mode:8s} last {run.last_s:6.1f}s  "
        f"origin÷size server {server} link {run.origin_bytes_link / size:.2f}  "
        f"cpu agents {run.cpu_agents_s:.1f}s downloads {run.cpu_downloads_s:.1f}s  [{ready}]"
    )
