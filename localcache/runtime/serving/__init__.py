"""Serving over HTTP: what the framework answers rather than asks.

- `httpserver`: /metrics, /healthz and /readyz (the Manager's probes), with connection limits.
- `admission`: the AdmissionServer (handlers by path, the aiohttp app); `review`: the
  AdmissionReview request and response as data.
- `tls`: the admission server over TLS with a hot-reloaded certificate.
- `certgen` (pure) and `certs` (the I/O): self-managed serving certificates, kept in a Secret
  and patched into webhook configurations' `caBundle`.

With `runtime.transport` and the download program, the only place that imports aiohttp.
"""
