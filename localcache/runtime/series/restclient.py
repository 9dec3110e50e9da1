"""client-go's REST client series and their recorder.

`rest_client_requests_total{code,method,host}` and `rest_client_request_duration_seconds{verb,
host}`, following client-go v0.36 (`component-base/metrics/prometheus/restclient`: `method`/
`verb` carry the HTTP method, `host` the apiserver's host:port, `code` the HTTP status or
`<error>` when none came). `RestClientRecorder` is what `transport.Transport` reports every
API request to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localcache.runtime.series import families

if TYPE_CHECKING:
    from localcache.runtime.metrics import Metrics

_bisect = families.bisect_left

#: rest_client_request_duration_seconds buckets, from client-go.
REST_CLIENT_LATENCY_BUCKETS: tuple[float, ...] = (
    *(0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0),
)
#: client-go's REST client families, in exposition order.
FAMILIES: tuple[families.Spec, ...] = (
    (
        "counter",
        "rest_client_requests_total",
        "Number of HTTP requests, partitioned by status code, method, and host.",
        ("code", "method", "host"),
        (),
    ),
    (
        "histogram",
        "rest_client_request_duration_seconds",
        "Request latency in seconds. Broken down by verb, and host.",
        ("verb", "host"),
        REST_CLIENT_LATENCY_BUCKETS,
    ),
)


class RestClientRecorder:
    """client-go's `rest_client_*` series (see `transport.RequestMetrics`); one per process,
    shared by every client that reports to it."""

    def __init__(self, metrics: Metrics) -> None:
        f = metrics.framework_families
        self._requests = f["rest_client_requests_total"]
        self._latency = f["rest_client_request_duration_seconds"]

    def inc_requests(self, code: str, method: str, host: str) -> None:
        self._requests.number(code, method, host).value += 1

    def observe_request_duration(self, verb: str, host: str, seconds: float) -> None:
        series = self._latency.buckets(verb, host)
        series.counts[_bisect(series.bounds, seconds)] += 1
        series.sum += seconds
