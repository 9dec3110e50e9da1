"""The framework series as plain numbers, and the collector that exposes them.

Framework series (controller-runtime's, the work queue's, client-go's REST client's) move on
every reconcile and queue operation, so they are plain Python numbers (`Number`, `Buckets`: no
lock, no label lookup, a histogram observation is one `bisect`) that one `Framework` collector
turns into prometheus_client metric families when the registry is read; a scrape therefore
always sees current values. Everything runs on one event loop. `WithoutCreated` is the view of
a registry that leaves out the `*_created` samples (Go has none).
"""

from __future__ import annotations

import bisect
import copy
import itertools
import math
from collections.abc import Callable, Iterator, Sequence

import prometheus_client
from prometheus_client import metrics_core, utils

#: One family: (type, name, help, label names, buckets).
Spec = tuple[str, str, str, tuple[str, ...], tuple[float, ...]]

CREATED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})
bisect_left = bisect.bisect_left


class WithoutCreated:
    """A collector view of a registry minus the `*_created` samples."""

    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[metrics_core.Metric]:
        for family in self._registry.collect():
            if family.type in CREATED_TYPES:
                family = copy.copy(family)
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


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


_go_float: Callable[[float], str] = utils.floatToGoString  # how `le` values are spelt


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
        self._kind = kind
        self._name = name
        self._doc = documentation
        self._labelnames = labelnames
        self._bounds = (*buckets, math.inf)  # prometheus_client adds +Inf the same way
        self._le = tuple(_go_float(b) for b in self._bounds)
        self._numbers: dict[tuple[str, ...], Number] = {}
        self._buckets: dict[tuple[str, ...], Buckets] = {}

    def number(self, *labelvalues: str) -> Number:
        return self._numbers.setdefault(labelvalues, Number())

    def buckets(self, *labelvalues: str) -> Buckets:
        return self._buckets.setdefault(labelvalues, Buckets(self._bounds))

    def metric(self) -> metrics_core.Metric:
        """The family with its current samples, as prometheus_client would render it."""
        if self._kind == "histogram":
            hist = metrics_core.HistogramMetricFamily(
                self._name, self._doc, labels=self._labelnames
            )
            for values, series in self._buckets.items():
                cumulative = map(float, itertools.accumulate(series.counts))
                hist.add_metric(values, list(zip(self._le, cumulative, strict=True)), series.sum)
            return hist
        family = (
            metrics_core.CounterMetricFamily
            if self._kind == "counter"
            else metrics_core.GaugeMetricFamily
        )
        metric = family(self._name, self._doc, labels=self._labelnames)
        for values, number in self._numbers.items():
            metric.add_metric(values, number.value)
        return metric


class Framework:
    """The collector of every framework family; one per `Metrics`."""

    def __init__(self, specs: Sequence[Spec]) -> None:
        self.families = {spec[1]: Family(*spec) for spec in specs}

    def collect(self) -> Iterator[metrics_core.Metric]:
        for family in self.families.values():
            yield family.metric()

    def describe(self) -> Iterator[metrics_core.Metric]:
        """The families (for the registry's duplicate-name check)."""
        return self.collect()
