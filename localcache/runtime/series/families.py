"""The framework series as plain numbers.

Framework series (controller-runtime's, the work queue's, client-go's REST client's) move on
every reconcile and queue operation, so they are plain Python numbers (`Number`, `Buckets`: no
lock, no label lookup, a histogram observation is one `bisect`) that `runtime.metrics` turns
into Prometheus metric families when the registry is read; a scrape therefore always sees
current values. Everything runs on one event loop.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

#: One family: (type, name, help, label names, buckets).
Spec = tuple[str, str, str, tuple[str, ...], tuple[float, ...]]

bisect_left = bisect.bisect_left


class Number:
    """One series of a framework counter or gauge: a plain number, read when collected."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0


class Buckets:
    """One series of a framework histogram: per-bucket (not cumulative) counts and the sum.
    The last bound is +Inf, so an observation `x` goes to `counts[bisect_left(bounds, x)]`
    (`le` is inclusive). Recorders update it inline: a method call per observation is a
    measurable share of a no-op reconcile."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0


class Family:
    """One framework family: its series by label values, as numbers or as bucket counts."""

    def __init__(
        self,
        kind: str,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        buckets: tuple[float, ...],
    ) -> None:
        self.kind = kind
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.bounds = (*buckets, math.inf)  # prometheus_client adds +Inf the same way
        self.numbers: dict[tuple[str, ...], Number] = {}
        self.series_buckets: dict[tuple[str, ...], Buckets] = {}

    def number(self, *labelvalues: str) -> Number:
        return self.numbers.setdefault(labelvalues, Number())

    def buckets(self, *labelvalues: str) -> Buckets:
        return self.series_buckets.setdefault(labelvalues, Buckets(self.bounds))


def families(specs: Sequence[Spec]) -> dict[str, Family]:
    """The families of `specs` by name."""
    return {spec[1]: Family(*spec) for spec in specs}
