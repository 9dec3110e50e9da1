"""The peer server's TLS: the certificate every agent serves (`tls.crt`/`tls.key`, DNS SAN
`localcache-peer`) from the mounted Secret directory (`/var/run/localcache/peer-tls`).

- `tls_from_dir(path)`: a `ReloadableTLS` (runtime.serving.tls): hand its `.context` to
  `PeerServer.start`; running its `watch(clock=...)` task swaps in a rotated certificate for
  new connections (the kubelet updates the mounted Secret in place).
- `ssl_context_from_dir(path)`: the same context, loaded now (reloaded at each call, e.g. on
  each start), for callers that do not run the watch.

Raises `OSError`/`ssl.SSLError` when the files are missing or do not match.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Final

from localcache.runtime.serving import tls

DEFAULT_DIR: Final = Path("/var/run/localcache/peer-tls")
CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
CA_FILE: Final = "ca.crt"


def tls_from_dir(path: Path = DEFAULT_DIR) -> tls.ReloadableTLS:
    return tls.ReloadableTLS(Path(path) / CERT_FILE, Path(path) / KEY_FILE)


def ssl_context_from_dir(path: Path = DEFAULT_DIR) -> ssl.SSLContext:
    return tls_from_dir(path).context
