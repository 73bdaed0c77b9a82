"""Claim declarations: parsing and validating what a request asks for.

A claim travels in ``SamplingParams.extra_args``, in one of three forms (docs/claims.md,
"Declaring a claim"):

- nested, from Python: ``{"kv_claim": {"claim_id": "c1", "protection_mode": "hard_protected"}}``
- one JSON string, over HTTP: ``{"kv_claim": "{\\"claim_id\\": \\"c1\\"}"}``
- flat keys, over HTTP (``vllm_xargs`` accepts only flat values):
  ``{"kv_claim_id": "c1", "kv_claim_mode": "hard_protected", "kv_claim_threshold_blocks": 60}``

A release travels the same way: ``{"kv_claim_release": "c1"}`` (or a list of ids).
Everything here is pure: no vLLM import, no I/O.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from kvclaims.contract.vocabulary import PROTECTION_MODES

# Flat HTTP keys -> claim fields.
_FLAT_KEYS: dict[str, str] = {
    "kv_claim_id": "claim_id",
    "kv_claim_tenant": "tenant",
    "kv_claim_mode": "protection_mode",
    "kv_claim_protection_mode": "protection_mode",
    "kv_claim_threshold_blocks": "threshold_blocks",
    "kv_claim_ttl_s": "ttl_s",
    "kv_claim_value": "value",
}
_FIELDS = ("claim_id", "tenant", "protection_mode", "threshold_blocks", "ttl_s", "value")
# The one rejection reason for an id that cannot be used: malformed, or already in force.
# NOTE: the same text for both, so a tenant cannot learn that another tenant holds an id.
UNUSABLE_CLAIM_ID = "claim_id must be a non-empty string not in use"



@dataclass(frozen=True)
class ClaimDeclaration:
    """A claim as declared by a request, before the arbiter has judged it."""

    claim_id: str
    tenant: str | None
    protection_mode: str | None  # None: the run policy's default mode applies
    threshold_blocks: int | None  # None: every full block of the prompt
    ttl_s: float | None
    value: float


@dataclass(frozen=True)
class Rejection:
    """A declaration that cannot be accepted; ``claim_id`` may be synthesised."""

    claim_id: str
    reason: str
    raw: dict[str, Any]


def raw_claim(extra_args: dict[str, Any] | None) -> dict[str, Any] | None:
    """Extract the claim's raw fields from ``extra_args`` in any of the three forms."""
    if not extra_args:
        return None
    if "kv_claim" in extra_args:
        value = extra_args["kv_claim"]
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                return {"__error__": f"kv_claim is not valid JSON: {exc.msg}"}
        if not isinstance(value, dict):
            return {"__error__": f"kv_claim must be an object, got {type(value).__name__}"}
        return dict(value)
    flat = {field: extra_args[key] for key, field in _FLAT_KEYS.items() if key in extra_args}
    return flat or None


def release_ids(extra_args: dict[str, Any] | None) -> list[str]:
    """Claim ids a request asks to release (``kv_claim_release``: an id or a list of ids)."""
    if not extra_args or "kv_claim_release" not in extra_args:
        return []
    value = extra_args["kv_claim_release"]
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [str(v) for v in value]
    return []


def declared_claim_id(raw: dict[str, Any], request_id: str) -> str:
    """The id a declaration is recorded under; a synthesised one when it names none."""
    claim_id = raw.get("claim_id")
    return claim_id if isinstance(claim_id, str) and claim_id else f"claim:{request_id}"


def parse_claim(raw: dict[str, Any], request_id: str,
                full_prompt_blocks: int) -> ClaimDeclaration | Rejection:
    """Validate one raw claim against the prompt that declares it."""
    claim_id = declared_claim_id(raw, request_id)
    if "__error__" in raw:
        return Rejection(claim_id, raw["__error__"], raw)
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        return Rejection(claim_id, f"unknown claim field(s): {unknown}", raw)
    if raw.get("claim_id") != claim_id:
        return Rejection(claim_id, UNUSABLE_CLAIM_ID, raw)
    tenant = raw.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        return Rejection(claim_id, "tenant must be a string", raw)
    mode = raw.get("protection_mode")
    if mode is not None and mode not in PROTECTION_MODES:
        return Rejection(claim_id, f"unknown protection_mode {mode!r}", raw)
    threshold = raw.get("threshold_blocks")
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, int):
            return Rejection(claim_id, "threshold_blocks must be an integer", raw)
        if threshold < 1:
            return Rejection(claim_id, "threshold_blocks must be at least 1", raw)
        if threshold > full_prompt_blocks:
            return Rejection(claim_id, f"threshold_blocks {threshold} is larger than the "
                             f"prefix ({full_prompt_blocks} full blocks)", raw)
    elif full_prompt_blocks < 1:
        return Rejection(claim_id, "the prompt has no full block to claim", raw)
    ttl = raw.get("ttl_s")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))
                            or not math.isfinite(ttl) or ttl <= 0):
        return Rejection(claim_id, "ttl_s must be a positive number", raw)
    if mode == "expiring" and ttl is None:
        return Rejection(claim_id, "protection_mode 'expiring' needs ttl_s", raw)
    value = raw.get("value", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        return Rejection(claim_id, "value must be a non-negative number", raw)
    return ClaimDeclaration(claim_id=claim_id, tenant=tenant, protection_mode=mode,
                            threshold_blocks=threshold, ttl_s=None if ttl is None else float(ttl),
                            value=float(value))
