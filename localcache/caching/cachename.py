"""What a cache's name must be for KServe to use it: a label value (issue 21 item 4).

The name of the cache serving an InferenceService (or LLMInferenceService) is written into its
label `internal.serving.kserve.io/localmodel`, and a label value has at most 63 characters
(`[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`; a cache name, a DNS subdomain, meets the pattern,
so its length alone decides). The validating webhook refuses longer names on create; the
mutation skips an existing long-named cache with a warning instead of writing an invalid label.
"""

from __future__ import annotations

from typing import Final

from localcache.api import inferenceservice

LABEL: Final = inferenceservice.LOCAL_MODEL_LABEL
LIMIT: Final = 63
"""The longest cache name that can be a label value."""


def fits_label(name: str) -> bool:
    """Whether a cache named `name` can be written into the serving object's label."""
    return len(name) <= LIMIT


def too_long(name: str) -> str:
    """Why a cache of this name cannot serve: `<name> is N characters; ...`."""
    shown = name if len(name) <= 80 else f"{name[:77]}..."
    return (
        f"{shown} is {len(name)} characters; a cache's name is written into the label {LABEL} "
        f"of every InferenceService it serves and must be at most {LIMIT} characters"
    )
