"""Label values from names of any length. Pure.

`value(name)` is `name` unchanged when it is a valid label value (at most 63 characters of
`[A-Za-z0-9_.-]`, alphanumeric at both ends), else the name cut to fit, its invalid
characters replaced by `-`, with 8 hex characters of a SHA-256 of the full name appended:
distinct names stay distinct (up to the hash), so selectors must use `value` too.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

MAX_VALUE: Final = 63
_NON_LABEL = re.compile(r"[^-A-Za-z0-9_.]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def value(name: str) -> str:
    """`name` as a valid label value (module docstring)."""
    if len(name) <= MAX_VALUE and _LABEL_VALUE.fullmatch(name):
        return name
    head = _NON_LABEL.sub("-", name)[: MAX_VALUE - 9].strip("-_.")
    return f"{head}-{_digest(name)}" if head else _digest(name)
