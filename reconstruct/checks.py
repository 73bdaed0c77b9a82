"""The one table of conformance checks and lowering classes.

Every check's id, title, the situation it needs (without it the verdict is ``not_exercised``),
what makes it fail, and two flags live here. ``reconstruct/sql/08_conformance.sql`` builds its
``kv_checks`` table from :func:`checks_values_sql` (``core.stage_sql`` fills the marker in),
the CLI's ``conformance --help`` lists :data:`CHECKS`, and docs/conformance.md's check table is
:func:`checks_markdown` (a test compares them). The lowering classes of seed 004 are
:data:`LOWERING_CLASSES`, in the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kvclaims.contract.vocabulary import CHECK, FINDING, sql_string


@dataclass(frozen=True)
class Check:
    """One conformance check.

    ``needs_engine``: it needs evidence only the in-engine recorder writes (an observed run
    reports it ``not_exercised``). ``judges_enforcement``: what follows a hook failure is
    ``unknown`` to it.
    """

    ord: int
    name: str
    title: str
    needs: str
    fails_when: str
    needs_engine: bool
    judges_enforcement: bool
    #: the finding kinds that fail the check (vocabulary.FINDING_KINDS); a check may also fail
    #: on evidence of its own (08_conformance.sql)
    fails_on: tuple[str, ...] = ()


#: NOTE: the one list of checks: SQL, CLI help and docs read it; ``ord`` orders the rows.
CHECKS: Final[tuple[Check, ...]] = (
    Check(1, CHECK.L1, "No accepted claim, no harm",
          "a block loss not covered by a claim accepted before it, or a claim_harmed report",
          "a loss not covered by an accepted claim is labelled harm; harm_without_acceptance",
          False, False,
          fails_on=(FINDING.harm_without_acceptance,)),
    Check(2, CHECK.L2, "Write no-admit serves the active request, yet residents are still evicted",
          "a write_no_admit run whose reuse-denied request was served while a resident block "
          "was lost to pressure",
          "the denied request was not served (refused, aborted, preempted), or it cached a "
          "block after its denial", True, True),
    Check(3, CHECK.L3,
          "A hard claim turns infeasibility into a refusal that names it, and loses nothing",
          "an accepted hard_protected claim under an enforcing policy facing an infeasible "
          "request (protected + active live > usable, rebuilt from the trace)",
          "a hard claim harmed; an infeasible deferral/refusal naming no hard claim; "
          "infeasible_admission; protected_block_lost; unjustified_refused or "
          "unjustified_deferred (it fit); any refusal_* finding", True, True,
          fails_on=(FINDING.infeasible_admission, FINDING.protected_block_lost,
                    FINDING.refusal_without_blocking_claim, FINDING.refusal_names_unknown_claim,
                    FINDING.refusal_names_claim_not_in_force,
                    FINDING.refusal_names_unmaterialized_claim,
                    FINDING.refusal_names_unprotected_claim, FINDING.unjustified_refused,
                    FINDING.unjustified_deferred, FINDING.refusal_names_claim_holding_no_blocks)),
    Check(4, CHECK.L4,
          "Demotion strictly precedes every later loss, which is relaxation, not harm",
          "a demoted claim instance that later lost content",
          "a harm row of a demoted instance (a loss before its demotion)", True, True,
          fails_on=(FINDING.demoted_not_demotable, FINDING.demotion_unjustified)),
    Check(5, CHECK.L5, "Expiry strictly precedes every later loss, which is expiry, not harm",
          "an expired claim instance that later lost content",
          "as L4 for expired instances, or an expiry before acceptance + ttl_s (premature)",
          False, True,
          fails_on=(FINDING.expired_not_expiring, FINDING.expired_without_ttl,
                    FINDING.expired_before_ttl)),
    Check(6, CHECK.L6, "Surviving block count is not the predicate",
          "a claim_materialized report, or an accepted claim whose leading positions were "
          "never all resident",
          "materialized_reported_predicate_false (the timeline does not show positions 0..k-1 "
          "bound and resident at the report, including a claim with no bound position), or a "
          "claim_harmed for a claim that never materialized", True, True,
          fails_on=(FINDING.materialized_reported_predicate_false,
                    FINDING.materialized_reported_not_accepted)),
    Check(7, CHECK.L7, "The reconstruction equals what the runtime reported",
          "a runtime report: claim_harmed, claim_materialized, a refusal, or a finished request "
          "whose cached tokens (reported or reconstructed) are not 0",
          "harm_not_reported, harm_reported_not_reconstructed, harm_reported_before_loss, "
          "materialized_reported_predicate_false, materialization_not_reported, "
          "shortfall_mismatch, cached_tokens_mismatch", True, True,
          fails_on=(FINDING.harm_not_reported, FINDING.harm_reported_not_reconstructed,
                    FINDING.harm_reported_before_loss,
                    FINDING.materialized_reported_predicate_false,
                    FINDING.materialization_not_reported, FINDING.shortfall_mismatch,
                    FINDING.cached_tokens_mismatch, FINDING.materialized_reported_not_accepted,
                    FINDING.hit_not_resident)),
    Check(8, CHECK.INV_no_harm_without_acceptance, "No harm without acceptance",
          "a harm, reported or reconstructed", "harm_without_acceptance", False, False,
          fails_on=(FINDING.harm_without_acceptance,)),
    Check(9, CHECK.INV_release_precedes_loss,
          "A release strictly precedes its relaxation/expiry losses",
          "a loss of a released, demoted or expired claim instance's content",
          "loss_before_release, label_without_prior_release", False, False,
          fails_on=(FINDING.loss_before_release, FINDING.label_without_prior_release)),
    Check(10, CHECK.INV_refusal_names_protected_claim,
          "Every refusal names an in-force, materialized, protected claim", "a request_refused",
          "any refusal_* finding; unjustified_refused (the request fit, rebuilt)", True, True,
          fails_on=(FINDING.refusal_without_blocking_claim, FINDING.refusal_names_unknown_claim,
                    FINDING.refusal_names_claim_not_in_force,
                    FINDING.refusal_names_unmaterialized_claim,
                    FINDING.refusal_names_unprotected_claim, FINDING.unjustified_refused,
                    FINDING.refusal_names_claim_holding_no_blocks)),
    Check(11, CHECK.INV_no_protected_loss,
          "No block of an in-force protected claim is lost under an enforcing policy",
          "a block loss while an accepted claim of a pinning mode was in force under an "
          "enforcing policy", "protected_block_lost", True, True,
          fails_on=(FINDING.protected_block_lost,)),
    Check(12, CHECK.INV_feasible_admission,
          "Every admission is feasible under an enforcing policy",
          "an admission under an enforcing policy while claims protected blocks (rebuilt)",
          "infeasible_admission (protected + active live > usable, rebuilt from the trace)",
          True, True,
          fails_on=(FINDING.infeasible_admission,)),
    # lifecycle legitimacy (docs/design.md §2 "Ownership", §5 "Lifecycle legitimacy")
    Check(13, CHECK.INV_release_by_owner,
          "Only the claim's own tenant or the operator ends a claim by release",
          "a claim_released whose format records released_by",
          "released_not_by_owner, released_by_arbiter, released_by_unknown", False, False,
          fails_on=(FINDING.released_not_by_owner, FINDING.released_by_arbiter,
                    FINDING.released_by_unknown)),
    # the seeds' label-side litmus
    Check(14, CHECK.LIT_soft_order,
          "A soft-priority claim loses blocks only after lower-priority content",
          "a loss of a soft_priority claim's block (position < k) while in force, under an "
          "enforcing policy",
          "such a loss labelled harm: a lower-priority evictable block (docs/design.md §3, the "
          "one statement of the order) existed", True, True),
    Check(15, CHECK.LIT_thresholded_value,
          "Value counts only a leading contiguous prefix of at least the threshold",
          "a loss of a materialized, in-force claim that broke its predicate while other bound "
          "blocks survived, or a loss beyond its threshold that left the predicate intact",
          "the claim's value_lost is not its whole value after a loss that broke the prefix, or "
          "a loss that left the prefix whole is its first harm", False, False),
    Check(16, CHECK.LIT_materialization_failure,
          "A claim whose predicate never held is never materialized, preserved or harmed",
          "an accepted claim whose leading prefix was never all resident while in force",
          "such a claim harmed, preserved, or reported claim_materialized", False, False),
    Check(20, CHECK.L_feasibility, "Feasibility is the seed's inequality, rebuilt from the trace",
          "a decision (admission, deferral, refusal) under an enforcing policy while claims "
          "protected blocks and other requests held live blocks",
          "infeasible_admission, unjustified_refused, unjustified_deferred, "
          "refusal_names_claim_holding_no_blocks, or a feasibility_disagreement / "
          "feasibility_figure_mismatch of severity disagreement", True, True,
          fails_on=(FINDING.infeasible_admission, FINDING.unjustified_refused,
                    FINDING.unjustified_deferred, FINDING.refusal_names_claim_holding_no_blocks,
                    FINDING.feasibility_disagreement, FINDING.feasibility_figure_mismatch)),
    Check(21, CHECK.L_chunking, "Chunking does not bound live KV",
          "a request whose prompt was allocated over more than one scheduler step (chunked "
          "prefill), with its admission decision in the trace",
          "chunk_counted_as_need: the runtime judged the admission on fewer blocks than the "
          "request's full prompt less hits", True, True,
          fails_on=(FINDING.chunk_counted_as_need,)),
    Check(22, CHECK.L_lowering, "A lowering claim is backed by the run's evidence",
          "a lowering section in the run's manifest",
          "lowering_claim_unsupported (the manifest claims a stronger class than the evidence "
          "gives, e.g. a mode whose promise was broken) or lowering_value_unknown (a value "
          "outside the vocabulary)", False, False,
          fails_on=(FINDING.lowering_claim_unsupported, FINDING.lowering_value_unknown)),
)


#: NOTE: ``conformance.evidence_seqs`` holds at most this many seqs, the smallest, ascending
#: (``evidence_seq_count`` says how many there are in all), and ``evidence_claims`` at most this
#: many claim instances, the smallest claim_seqs (``evidence_claim_count``): a list of every
#: one grows with the run's length and cannot spill (docs/conformance.md). 20 is what a
#: table cell, the CLI's one line per check and an operator's first look can use.
EVIDENCE_MAX: Final[int] = 20


@dataclass(frozen=True)
class LoweringClass:
    """One lowering class of seed 004 (fail-closed): what a mode's evidence in a run shows."""

    name: str
    means: str


#: NOTE: ordered strongest first; a manifest may claim any of these (or the legacy words of
#: LEGACY_LOWERING), anything else is outside the vocabulary.
LOWERING_CLASSES: Final[tuple[LoweringClass, ...]] = (
    LoweringClass("native conformance",
                  "the runtime itself binds the mode to claim identity, predicate, ordered "
                  "lifecycle events and claim-scoped outcomes; never derived from a kvclaims "
                  "trace, whose claims go through hooks added to vLLM (an adapter)"),
    LoweringClass("adapter-policy evidence",
                  "an enforcing policy kept the mode's promise in this run under pressure: a "
                  "claim of the mode met a conflict (an infeasible decision, or an eviction "
                  "while it was in force) and no check of the mode failed"),
    LoweringClass("adapter-observational evidence",
                  "claims of the mode were recorded and judged, never enforced (a policy that "
                  "enforces no claim, or an observed run)"),
    LoweringClass("approximation substrate",
                  "the runtime keeps part of the promise (an eviction order, a best effort): "
                  "a primitive, not a claim"),
    LoweringClass("rejected mapping",
                  "claims of the mode are refused at submission (fail-closed), or its promise "
                  "was broken in this run"),
    LoweringClass("unknown evidence",
                  "the run does not show whether the promise is kept: no claim of the mode met "
                  "pressure, or the evidence lies behind a hole or a hook failure"),
)

#: The verdict words of older manifests, read as the class they claimed.
LEGACY_LOWERING: Final[dict[str, str]] = {
    "enforced": "adapter-policy evidence", "approximated": "approximation substrate",
    "rejected": "rejected mapping", "recorded only": "adapter-observational evidence",
}


def check_fails_values_sql() -> str:
    """08_conformance's ``fails`` as a SQL ``VALUES`` list (check, kind): the finding kinds that
    fail each check (:attr:`Check.fails_on`)."""
    return ",\n    ".join(f"({sql_string(c.name)}, {sql_string(kind)})"
                          for c in CHECKS for kind in c.fails_on)


def checks_values_sql() -> str:
    """``kv_checks`` as a SQL ``VALUES`` list (ord, check, title, needs, needs_engine,
    judges_enforcement)."""
    rows = [f"({c.ord}, {sql_string(c.name)}, {sql_string(c.title)}, {sql_string(c.needs)}, "
            f"{str(c.needs_engine).lower()}, {str(c.judges_enforcement).lower()})"
            for c in CHECKS]
    return ",\n    ".join(rows)


def lowering_values_sql() -> str:
    """``kv_lowering_words`` as a SQL ``VALUES`` list (word, class, rank): every word a
    manifest may use for a class (the class's own name, or a legacy verdict), rank 1 strongest.
    """
    rank = {c.name: i for i, c in enumerate(LOWERING_CLASSES, start=1)}
    words = [(c.name, c.name) for c in LOWERING_CLASSES] + list(LEGACY_LOWERING.items())
    return ",\n    ".join(f"({sql_string(w)}, {sql_string(c)}, {rank[c]})" for w, c in words)


def checks_markdown() -> str:
    """docs/conformance.md's check table, generated from :data:`CHECKS`."""
    lines = ["| check | title | needs (else `not_exercised`) | in-engine | fails when |",
             "|---|---|---|---|---|"]
    for c in CHECKS:
        lines.append(f"| `{c.name}` | {c.title} | {c.needs} | "
                     f"{'yes' if c.needs_engine else 'no'} | {c.fails_when} |")
    return "\n".join(lines)


def lowering_markdown() -> str:
    """docs/conformance.md's lowering class table, generated from :data:`LOWERING_CLASSES`."""
    lines = ["| class | means |", "|---|---|"]
    lines += [f"| `{c.name}` | {c.means} |" for c in LOWERING_CLASSES]
    return "\n".join(lines)


def checks_help() -> str:
    """The check list for ``kvclaims conformance --help``."""
    return "checks (each needs its situation, else not_exercised):\n" + "\n".join(
        f"  {c.name}: {c.title}" for c in CHECKS)


def fill_sql(sql: str) -> str:
    """Fill the markers of a stage's SQL text: the tables (``/*@KV_CHECKS@*/``,
    ``/*@KV_CHECK_FAILS@*/``, ``/*@KV_LOWERING_CLASSES@*/``) and the evidence bound
    (``/*@EVIDENCE_MAX@*/``)."""
    return (sql.replace("/*@KV_CHECKS@*/", checks_values_sql())
               .replace("/*@KV_CHECK_FAILS@*/", check_fails_values_sql())
               .replace("/*@KV_LOWERING_CLASSES@*/", lowering_values_sql())
               .replace("/*@EVIDENCE_MAX@*/", str(EVIDENCE_MAX)))
