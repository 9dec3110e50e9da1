"""TLS versions and cipher suites of the admission server, named as KServe's localmodel
processes name them (`--tls-min-version`, `--tls-cipher-suites`, KServe #5791: Go's names).

- `resolve(min_version, cipher_suites)` turns the flags' text into `TLSOptions` or raises
  `ValueError` naming what it does not know. The minimum version is `VersionTLS12` (the
  default) or `VersionTLS13`. Cipher suites are IANA names, comma-separated; empty means the
  hardened default: the ECDHE suites with AEAD (AES-GCM, ChaCha20-Poly1305), as KServe's
  Intermediate defaults. TLS 1.3's own suites are accepted and, as in Go, not configurable:
  a TLS 1.3 handshake always offers all three.
- `TLSOptions.apply(context)` sets them on a server `ssl.SSLContext`.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Final

VERSIONS: Final = {"VersionTLS12": ssl.TLSVersion.TLSv1_2, "VersionTLS13": ssl.TLSVersion.TLSv1_3}

#: Go's (IANA) names of the TLS 1.2 suites OpenSSL offers, with OpenSSL's names.
TLS12_SUITES: Final = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
}
#: Go's other spelling of the two ChaCha20 suites.
ALIASES: Final = {
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
}
TLS13_SUITES: Final = frozenset(
    {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
)
DEFAULT_SUITES: Final = tuple(
    name for name in TLS12_SUITES if "ECDHE" in name and "CBC" not in name
)


@dataclass(frozen=True)
class TLSOptions:
    minimum_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    suites: tuple[str, ...] = DEFAULT_SUITES  # TLS 1.2 suites, IANA names

    def apply(self, context: ssl.SSLContext) -> None:
        context.minimum_version = self.minimum_version
        if self.minimum_version < ssl.TLSVersion.TLSv1_3:
            context.set_ciphers(":".join(TLS12_SUITES[name] for name in self.suites))


def resolve(min_version: str, cipher_suites: str) -> TLSOptions:
    """The options the flags name (module doc); `ValueError` for a name it does not know."""
    version = VERSIONS.get(min_version.strip() or "VersionTLS12")
    if version is None:
        raise ValueError(f"unknown TLS version {min_version!r}: use {' or '.join(VERSIONS)}")
    names = [n.strip() for n in cipher_suites.split(",") if n.strip()]
    unknown = [
        n for n in names if n not in TLS12_SUITES and n not in ALIASES and n not in TLS13_SUITES
    ]
    if unknown:
        raise ValueError(f"unknown cipher suites {', '.join(unknown)} (Go's names, such as "
                         f"{DEFAULT_SUITES[0]})")  # fmt: skip
    tls12 = tuple(dict.fromkeys(ALIASES.get(n, n) for n in names if n not in TLS13_SUITES))
    if names and not tls12 and version < ssl.TLSVersion.TLSv1_3:
        raise ValueError("only TLS 1.3 suites named: name TLS 1.2 suites too, or VersionTLS13")
    return TLSOptions(minimum_version=version, suites=tls12 or DEFAULT_SUITES)
