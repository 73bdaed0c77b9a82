"""Run policies: how one engine treats the claims its requests declare.

A claim states its own protection mode; the run policy decides whether modes are enforced and
which mode a claim gets when it states none. This table is the single source of truth for the
``--policy`` option, the manifest's ``enforcement`` section and the docs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kvclaims.contract.schema import InputError
from kvclaims.contract.vocabulary import POLICY_NAMES


@dataclass(frozen=True)
class Policy:
    """One run policy."""

    name: str
    enforce: bool  # False: claims are recorded and judged, never enforced
    default_mode: str  # mode of a claim that declares none
    deny_reuse: bool  # write no-admit: blocks of claim-less requests never become reusable
    summary: str


POLICIES: Final[dict[str, Policy]] = {
    p.name: p
    for p in (
        Policy("native", False, "hard_protected", False,
               "vLLM as shipped: claims are recorded, nothing is enforced"),
        Policy("write_no_admit", False, "hard_protected", True,
               "claim-less requests' blocks never become reusable (reuse_denied); "
               "claims are recorded, not enforced"),
        Policy("hard_protected", True, "hard_protected", False,
               "claims are enforced by their mode; a claim without a mode is hard_protected"),
        Policy("demote_on_conflict", True, "demotable", False,
               "claims are enforced by their mode; a claim without a mode is demotable"),
        Policy("ttl_expiry", True, "expiring", False,
               "claims are enforced by their mode; a claim without a mode is expiring"),
    )
}
assert tuple(POLICIES) == POLICY_NAMES  # NOTE: the vocabulary names every policy, in order

# The lowering verdicts: what a runtime does with each mode's promise.
VERDICTS: Final[tuple[str, ...]] = ("enforced", "approximated", "rejected", "recorded only")

OFFLOAD_REJECTION: Final[str] = (
    "protection_mode 'offloadable' needs a lower KV tier (offload connector), which this "
    "runtime does not have")

# Verdict and evidence per mode when the policy enforces claims (manifest + docs).
ENFORCED_LOWERING: Final[dict[str, tuple[str, str]]] = {
    "best_effort": ("recorded only", "its blocks are ordinary cache entries; the mode promises "
                    "nothing beyond recording"),
    "soft_priority": ("approximated", "before each allocation its cached blocks are moved "
                      "behind every unclaimed eviction candidate in vLLM's free queue"),
    "hard_protected": ("enforced", "its cached blocks hold an extra reference (BlockPool.touch) "
                       "and are never victims; infeasible requests are deferred, then refused"),
    "demotable": ("enforced", "protected like hard_protected until a conflict, then the fewest, "
                  "lowest-value claims are demoted (claim_demoted) before any loss"),
    "expiring": ("enforced", "protected like hard_protected until ttl_s on the engine clock, "
                 "then claim_expired and ordinary"),
    "offloadable": ("rejected", OFFLOAD_REJECTION),
}

# One line per mode for the manifest's ``enforcement`` section (kept for older readers).
MODE_ENFORCEMENT: Final[dict[str, str]] = {
    mode: f"{verdict}: {evidence}" for mode, (verdict, evidence) in ENFORCED_LOWERING.items()}


def lowering(policy: Policy) -> dict[str, dict[str, str]]:
    """Per protection mode, the verdict and one line of evidence for this run's policy.

    NOTE: the manifest carries this as ``lowering``; ``offloadable`` is rejected under every
    policy (fail-closed: a promise the runtime cannot keep is never accepted).
    """
    out: dict[str, dict[str, str]] = {}
    for mode, (verdict, evidence) in ENFORCED_LOWERING.items():
        if not policy.enforce and verdict != "rejected":
            verdict, evidence = "recorded only", (
                f"policy {policy.name} does not enforce claims: accepted, recorded and judged")
        out[mode] = {"verdict": verdict, "evidence": evidence}
    return out


def get_policy(name: str) -> Policy:
    """Look a policy up by name, with a clear error listing the choices."""

    try:
        return POLICIES[name]
    except KeyError:
        raise InputError(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}") from None
