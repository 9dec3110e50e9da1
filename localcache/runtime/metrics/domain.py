"""Domain metrics: counters, gauges and histograms that domain code declares through
`Metrics.counter()`, `gauge()` and `histogram()`, so it never imports prometheus_client.
Label values are passed as keyword arguments."""

from __future__ import annotations

import prometheus_client


class CounterFamily:
    """A domain counter; pass label values as keyword arguments (any label name works)."""

    def __init__(self, metric: prometheus_client.Counter, labelled: bool) -> None:
        self._metric = metric
        self._labelled = labelled

    def inc(self, amount: float = 1.0, /, **labels: str) -> None:
        (self._metric.labels(**labels) if self._labelled else self._metric).inc(amount)


class GaugeFamily:
    """A domain gauge; pass label values as keyword arguments."""

    def __init__(self, metric: prometheus_client.Gauge, labelnames: tuple[str, ...]) -> None:
        self._metric = metric
        self._labelnames = labelnames
        self._labelled = bool(labelnames)

    def _child(self, labels: dict[str, str]) -> prometheus_client.Gauge:
        return self._metric.labels(**labels) if self._labelled else self._metric

    def set(self, value: float, /, **labels: str) -> None:
        self._child(labels).set(value)

    def inc(self, amount: float = 1.0, /, **labels: str) -> None:
        self._child(labels).inc(amount)

    def dec(self, amount: float = 1.0, /, **labels: str) -> None:
        self._child(labels).dec(amount)

    def remove(self, **labels: str) -> None:
        """Drop the series with these label values (e.g. a model that is gone)."""
        self._metric.remove(*(labels[n] for n in self._labelnames))


class HistogramFamily:
    """A domain histogram; pass label values as keyword arguments."""

    def __init__(self, metric: prometheus_client.Histogram, labelled: bool) -> None:
        self._metric = metric
        self._labelled = labelled

    def observe(self, value: float, /, **labels: str) -> None:
        (self._metric.labels(**labels) if self._labelled else self._metric).observe(value)
