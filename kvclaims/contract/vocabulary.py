"""The vocabulary of kvclaims, in one place (docs/design.md §4-§7).

Every other part reads these names instead of retyping them: the recorder and the importers
(modes), the labelling pass (label codes), the SQL stages and views (through the
``{group.term}`` placeholders that ``fill_sql`` fills from ``GROUPS``), the dashboard, the
report and the explanations (``LABEL.harm``, ``EVENT.claim_demoted``, ...).
``tests/test_vocabulary.py`` fails on a vocabulary literal in SQL, dashboard, report or
explanation code that is not read from here.

NOTE: this module imports nothing of kvclaims: it is the bottom of the import graph.
"""

from __future__ import annotations

import keyword
import re
from types import SimpleNamespace
from typing import Final

# -- events (docs/design.md §4; kvclaims.contract.schema.EVENTS gives each one's fields) --------
EVENT_NAMES: Final[tuple[str, ...]] = (
    "run_started", "run_finished", "recorder_gap", "request_arrived", "request_admitted",
    "request_deferred", "request_refused", "request_preempted", "request_finished",
    "block_allocated", "block_cached", "block_hit", "block_freed", "block_evicted",
    "cache_reset", "reuse_denied", "claim_submitted", "claim_accepted", "claim_rejected",
    "claim_bound", "claim_materialized", "claim_demoted", "claim_expired", "claim_released",
    "claim_release_refused", "claim_harmed", "hook_failed")
# block_evicted.cause; "unknown": an observed eviction whose cause the evidence does not say.
EVICTION_CAUSES: Final[tuple[str, ...]] = ("allocation", "reset", "explicit", "unknown")

# -- protection modes (docs/design.md §3) --------------------------------------------------------
PROTECTION_MODES: Final[tuple[str, ...]] = (
    "best_effort", "soft_priority", "hard_protected", "demotable", "expiring", "offloadable")
# Modes whose blocks the arbiter pins (vLLM's BlockPool.touch) while the claim is in force.
PINNING_MODES: Final[frozenset[str]] = frozenset({"hard_protected", "demotable", "expiring"})
# Modes that promise residency: a loss that breaks their predicate while in force is harm.
# NOTE: best_effort promises nothing (never harm); soft_priority promises eviction order only
# (harm only when a lower-priority evictable block existed). offloadable promised "moved, never
# lost"; the recorder rejects it at submission, but an older trace that accepted one shows a
# loss of it as harm (the promise was accepted and not kept).
RESIDENCY_MODES: Final[frozenset[str]] = PINNING_MODES | {"offloadable"}

# -- run policies (kvclaims.contract.policies holds what each one does) ------------------------
POLICY_NAMES: Final[tuple[str, ...]] = (
    "native", "write_no_admit", "hard_protected", "demote_on_conflict", "ttl_expiry")

# -- loss labels (docs/design.md §5) -------------------------------------------------------------
# Most severe first: a block bound to several claim instances takes the first that applies.
# NOTE: unknown ranks above harm: a hole that could change the answer is never hidden behind a
# verdict; every page, table and chart ranks labels in this one order.
LABELS: Final[tuple[str, ...]] = ("unknown", "harm", "expiry", "relaxation", "eviction")
# The labelling pass's codes: a higher code is more severe (eviction 1 .. unknown 5).
LABEL_SEVERITY: Final[dict[str, int]] = {
    label: len(LABELS) - i for i, label in enumerate(LABELS)}

# -- outcomes (docs/design.md §6) ----------------------------------------------------------------
CLAIM_OUTCOMES: Final[tuple[str, ...]] = (
    "harmed", "unknown", "demoted", "expired", "released", "rejected", "preserved",
    "never_materialized")
REQUEST_OUTCOMES: Final[tuple[str, ...]] = (
    "refused", "aborted", "preempted", "unknown", "deferred_then_served", "served")

# -- findings (docs/reconstruction.md "Findings") ------------------------------------------------
# Most severe first.
FINDING_SEVERITIES: Final[tuple[str, ...]] = (
    "violation", "security", "disagreement", "hole", "anomaly", "info")

# Every kind of finding (``findings.kind``), grouped as docs/reconstruction.md lists them. A
# kind's severity is decided where the finding is made (07_findings.sql): some depend on the
# run's policy.
FINDING_KINDS: Final[tuple[str, ...]] = (
    # holes: what the trace cannot show
    "recorder_gap", "seq_hole", "missing_head", "truncated", "hook_failed",
    # the runtime's reports against the reconstruction
    "harm_not_reported", "harm_reported_not_reconstructed", "harm_reported_before_loss",
    "materialized_reported_predicate_false", "materialized_reported_not_accepted",
    "materialization_not_reported", "shortfall_mismatch", "feasibility_disagreement",
    "feasibility_figure_mismatch", "cached_tokens_mismatch", "chunk_counted_as_need",
    "lowering_value_unknown", "lowering_claim_unsupported", "hit_not_resident",
    # violations of the promises
    "harm_without_acceptance", "loss_before_release", "label_without_prior_release",
    "protected_block_lost", "infeasible_admission", "refusal_without_blocking_claim",
    "refusal_names_unknown_claim", "refusal_names_claim_not_in_force",
    "refusal_names_unmaterialized_claim", "refusal_names_unprotected_claim",
    "unjustified_refused", "unjustified_deferred", "refusal_names_claim_holding_no_blocks",
    "demotion_unjustified",
    # lifecycle events their rules do not allow (02_claims.sql: broken_rule)
    "demoted_not_demotable", "expired_not_expiring", "expired_without_ttl",
    "expired_before_ttl", "released_not_by_owner", "released_by_arbiter", "released_by_unknown",
    # security: a release the arbiter refused (someone tried to end another tenant's claim)
    "claim_release_refused",
    # anomalies: the trace contradicts itself
    "evicted_unknown_content", "evicted_block_not_resident", "evicted_hash_mismatch",
    "block_overwritten", "claim_never_submitted", "claim_never_decided", "lifecycle_unverified")

# -- conformance checks (reconstruct/checks.py: each one's title, situation and failing kinds) --
CHECK_NAMES: Final[tuple[str, ...]] = (
    "L1", "L2", "L3", "L4", "L5", "L6", "L7", "INV_no_harm_without_acceptance",
    "INV_release_precedes_loss", "INV_refusal_names_protected_claim", "INV_no_protected_loss",
    "INV_feasible_admission", "INV_release_by_owner", "LIT_soft_order", "LIT_thresholded_value",
    "LIT_materialization_failure", "L_feasibility", "L_chunking", "L_lowering")

# -- admission decisions (feasibility.decision: the request_* event, docs/conformance.md) --------
DECISIONS: Final[tuple[str, ...]] = ("admitted", "deferred", "refused")

# -- where a run's evidence comes from (runs.evidence, runs.lifecycle_source) --------------------
# in_engine: our recorder, imports, fixtures; observed: the stock-vLLM listener (claims declared
# beside the engine: no in-engine requests or admissions, docs/stock-vllm.md).
RUN_EVIDENCE: Final[tuple[str, ...]] = ("in_engine", "observed")
# The format a run's lifecycle events come from: the paper prototype's records no ttl_s and no
# released_by (docs/design.md §5 "Lifecycle legitimacy").
LIFECYCLE_SOURCES: Final[tuple[str, ...]] = ("kvclaims", "prototype")

# -- verdicts (docs/conformance.md) --------------------------------------------------------------
# A check that nothing in the run exercised is ``not_exercised``, never a pass.
CHECK_VERDICTS: Final[tuple[str, ...]] = ("fail", "unknown", "pass", "not_exercised")

# -- who may end a claim's force (claim_released.released_by, docs/design.md §2) ----------------
RELEASERS: Final[tuple[str, ...]] = ("tenant", "operator", "arbiter")

# -- the reconstructed tables, in the order they are built and written --------------------------
TABLE_NAMES: Final[tuple[str, ...]] = (
    "losses", "loss_claims", "claims", "requests", "feasibility", "findings", "conformance")
# Verdict tables: computed from the others, readable like them (docs/conformance.md).
VERDICT_TABLES: Final[tuple[str, ...]] = ("conformance", "lowering")


# -- the vocabulary as SQL reads it --------------------------------------------------------------
# NOTE: a SQL stage or view names a term as ``{group.term}`` (e.g. ``{label.harm}``); ``fill_sql``
# replaces it with the quoted term and refuses a term the group does not have, so that SQL never
# spells the vocabulary itself and a renamed term fails loudly instead of matching nothing.
GROUPS: Final[dict[str, tuple[str, ...]]] = {
    "event": EVENT_NAMES, "cause": EVICTION_CAUSES, "mode": PROTECTION_MODES,
    "policy": POLICY_NAMES, "label": LABELS, "claim_outcome": CLAIM_OUTCOMES,
    "request_outcome": REQUEST_OUTCOMES, "severity": FINDING_SEVERITIES,
    "verdict": CHECK_VERDICTS, "releaser": RELEASERS, "finding": FINDING_KINDS,
    "check": CHECK_NAMES, "decision": DECISIONS, "evidence": RUN_EVIDENCE,
    "lifecycle_source": LIFECYCLE_SOURCES,
}
_TERM: Final = re.compile(r"\{([a-z_]+)\.([A-Za-z0-9_]+)\}")


def sql_string(text: str) -> str:
    """``text`` as a SQL string literal (quoted, its quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


def fill_sql(text: str) -> str:
    """``text`` with every ``{group.term}`` replaced by the quoted term (ValueError if unknown)."""
    def term(m: re.Match[str]) -> str:
        group, name = m.group(1), m.group(2)
        if name not in GROUPS.get(group, ()):
            raise ValueError(f"{{{group}.{name}}}: not a term of the vocabulary")
        return sql_string(name)

    return _TERM.sub(term, text)


# -- the vocabulary as Python reads it -----------------------------------------------------------
# NOTE: pages name a term as ``LABEL.harm``, ``EVENT.claim_demoted``, ...: an attribute the
# vocabulary lacks is an AttributeError at once, where a misspelt string would match nothing. A
# term that is a Python keyword takes a trailing underscore (``VERDICT.pass_``).
def _terms(names: tuple[str, ...]) -> SimpleNamespace:
    return SimpleNamespace(**{name + "_" * keyword.iskeyword(name): name for name in names})


EVENT: Final = _terms(EVENT_NAMES)
MODE: Final = _terms(PROTECTION_MODES)
POLICY: Final = _terms(POLICY_NAMES)
LABEL: Final = _terms(LABELS)
CLAIM_OUTCOME: Final = _terms(CLAIM_OUTCOMES)
REQUEST_OUTCOME: Final = _terms(REQUEST_OUTCOMES)
SEVERITY: Final = _terms(FINDING_SEVERITIES)
VERDICT: Final = _terms(CHECK_VERDICTS)
FINDING: Final = _terms(FINDING_KINDS)
DECISION: Final = _terms(DECISIONS)
CHECK: Final = _terms(CHECK_NAMES)

