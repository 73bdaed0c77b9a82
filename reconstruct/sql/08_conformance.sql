-- Stage 7: conformance litmus L1..L7 and invariants, one row per run and check, and the
-- lowering verdict of every protection mode, one row per run and mode.
-- The rules (what each check needs, means, and how each verdict is decided) are
-- docs/conformance.md; every verdict is computed from the trace, never hard-coded.
--
-- Verdict, first match:
--   1. observed run (stock-vLLM listener) and the check needs in-engine evidence -> not_exercised
--   2. failing evidence before the run's first hook_failed (or no hook failure) -> fail
--   3. failing evidence only at/after the first hook_failed                     -> unknown
--   4. the run has a hole (gap, seq hole, truncation)                           -> unknown
--   5. the check judges enforcement, was exercised, and some of its
--      evidence, or any enforcement event of the run, lies after the first
--      hook_failed                                                             -> unknown
--   6. L3 / INV_refusal_names_protected_claim / L_feasibility: a deferral or
--      refusal whose feasibility the trace cannot rebuild (need unknown)        -> unknown
--   7. the situation the check needs did not occur                              -> not_exercised
--   8. otherwise                                                                -> pass
-- NOTE: not_exercised is never a pass: a check passes only where its situation occurred.
-- NOTE: events come from kv_stage_events (05_feasibility: the non-block events, scanned once);
-- block evictions from `losses` (one row per block_evicted); block_cached only for L2.

-- The checks: id, human title, the situation each needs, whether it needs in-engine evidence
-- (else an observed run can exercise it) and whether it judges enforcement (then what follows
-- a hook failure is unknown to it).
-- NOTE: the one list of checks is kvclaims.reconstruct.checks.CHECKS (Python); core.stage_sql
-- fills the marker below with it. The CLI help and docs/conformance.md come from the same list.
CREATE OR REPLACE TEMP TABLE kv_checks AS
SELECT * FROM (VALUES
    /*@KV_CHECKS@*/
) t(ord, "check", title, needs, needs_engine, judges_enforcement);

CREATE OR REPLACE TABLE conformance AS
WITH fk AS (
    -- NOTE: a finding of severity info (the expected consequence of a policy that enforces
    -- no claim) fails no check
    SELECT run_id, kind, seq, claim_seq FROM findings WHERE severity <> {severity.info}
), fails AS (
    -- the finding kinds that fail each check
    -- NOTE: checks.Check.fails_on is the one list; core.stage_sql fills the marker with it
    SELECT * FROM (VALUES
        /*@KV_CHECK_FAILS@*/
    ) t(check_name, kind)
), finding_fails AS (
    SELECT f.check_name, k.run_id, k.seq, k.kind, k.claim_seq
    FROM fails f JOIN fk k ON k.kind = f.kind
), failed AS (
    -- each (run, check) that failing findings fail: their seqs, their claim instances, and
    -- their kinds with how many of each ('kind xN, ...', by kind)
    -- NOTE: one aggregate of finding_fails (as large as the failing findings), joined on
    -- (run, check): not one correlated subquery over it per column
    SELECT run_id, check_name,
           flatten(list(seqs)) AS seqs,
           nullif(list_distinct(flatten(list(claim_seqs))), []::BIGINT[]) AS claim_seqs,
           string_agg(kind || ' x' || n, ', ' ORDER BY kind) AS kinds
    FROM (SELECT run_id, check_name, kind, count(*) AS n,
                 list(seq) FILTER (WHERE seq IS NOT NULL) AS seqs,
                 list(DISTINCT claim_seq) FILTER (WHERE claim_seq IS NOT NULL) AS claim_seqs
          FROM finding_fails
          GROUP BY run_id, check_name, kind)
    GROUP BY run_id, check_name
), c AS (
    SELECT * FROM kv_claim_facts
), uncovered_losses AS (
    -- L1: the losses not covered by any claim accepted before them (uncovered), and those
    -- labelled harm that no claim accepted before them labels harm
    -- NOTE: the labelling pass marks each loss (kv_losses.covered / covered_harm) from its
    -- bound instances: no grouping of loss_claims, no join with the losses
    SELECT run_id, seq, NOT covered AS uncovered,
           label = {label.harm} AND NOT covered_harm AS uncovered_harm
    FROM kv_losses
    WHERE NOT covered OR (label = {label.harm} AND NOT covered_harm)
), first_uncovered AS (
    -- the 10 smallest seqs of each run's uncovered losses, ascending
    -- NOTE: row_number() filtered in WHERE: DuckDB runs it as a top-N, Spark can run it too
    SELECT run_id, list(seq ORDER BY seq) AS first_seqs
    FROM (SELECT run_id, seq, row_number() OVER (PARTITION BY run_id ORDER BY seq) AS rank
          FROM uncovered_losses WHERE uncovered)
    WHERE rank <= 10
    GROUP BY run_id
), uncovered AS (
    -- per run: how many uncovered losses (NULL: none), the first of them, and the seqs of
    -- the uncovered harms
    SELECT u.run_id, u.n, f.first_seqs, u.harm_seqs
    FROM (SELECT run_id, nullif(count(*) FILTER (WHERE uncovered), 0) AS n,
                 list(seq ORDER BY seq) FILTER (WHERE uncovered_harm) AS harm_seqs
          FROM uncovered_losses
          GROUP BY run_id) u
    LEFT JOIN first_uncovered f ON f.run_id = u.run_id
), denied_cached AS (
    -- the block_cached events of reuse-denied requests (the only block events this stage scans)
    SELECT e.run_id, e.request_id, e.seq
    FROM events e
    WHERE e.event = {event.block_cached}
      AND e.request_id IN (SELECT request_id FROM requests WHERE reuse_denied)
), denied AS (
    -- L2: each reuse-denied request, whether it was served, and the residents lost while it ran
    SELECT q.run_id, q.request_id, q.reuse_denied_seq, q.finished_seq, q.refused_seq,
           q.outcome IN ({request_outcome.served}, {request_outcome.deferred_then_served}) AS served,
           q.outcome NOT IN ({request_outcome.served}, {request_outcome.deferred_then_served}, {request_outcome.unknown}) AS not_served,
           (SELECT list(e.seq ORDER BY e.seq) FROM denied_cached e
            WHERE e.run_id = q.run_id
              AND e.request_id = q.request_id AND e.seq > q.reuse_denied_seq) AS cached_after,
           (SELECT list(l.seq ORDER BY l.seq) FROM losses l
            WHERE l.run_id = q.run_id AND l.was_resident
              AND (l.by_request_id = q.request_id
                   OR (l.seq > q.reuse_denied_seq
                       AND l.seq <= coalesce(q.finished_seq, q.refused_seq, l.seq)))) AS lost
    FROM requests q WHERE q.reuse_denied
), hard_conflicts AS (
    -- L3: an infeasible request facing an accepted hard claim in force: the runtime's own
    -- deferral/refusal naming it, or an admission/deferral the trace shows infeasible while
    -- the hard claim held protected blocks
    -- NOTE: only where the rebuilt figures are infeasible: a refusal of a request that fit
    -- is no conflict (it fails L3 through unjustified_refused)
    SELECT x.run_id, x.seq, x.event, c.claim_seq
    FROM kv_claim_refs x JOIN c ON c.run_id = x.run_id AND c.claim_seq = x.claim_seq
    JOIN feasibility fx ON fx.run_id = x.run_id AND fx.seq = x.seq
    WHERE x.event IN ({event.request_deferred}, {event.request_refused}) AND NOT fx.feasible
      AND c.protection_mode = {mode.hard_protected} AND c.accepted_seq < x.seq
    UNION
    SELECT f.run_id, f.seq, f.event, c.claim_seq
    FROM feasibility f
    JOIN c ON c.run_id = f.run_id AND list_contains(f.protected_claim_seqs, c.claim_seq)
    WHERE NOT f.feasible AND c.protection_mode = {mode.hard_protected}
), released_losses AS (
    -- L4 / L5: per demoted (expired) instance, its losses after the release; from loss_claims
    -- alone (it carries release_seq/release_event), joined to the instances below
    SELECT run_id, claim_seq,
           count(*) FILTER (WHERE seq > release_seq) AS n_later,
           min(seq) FILTER (WHERE seq > release_seq) AS first_later_seq,
           count(*) FILTER (WHERE seq > release_seq AND label = {label.relaxation}) AS n_relaxation,
           count(*) FILTER (WHERE seq > release_seq AND label = {label.expiry}) AS n_expiry,
           count(*) FILTER (WHERE seq > release_seq
                              AND label NOT IN ({label.relaxation}, {label.expiry})) AS n_other,
           list(seq ORDER BY seq) FILTER (WHERE label = {label.harm}) AS harm_seqs
    FROM loss_claims
    WHERE release_event IN ({event.claim_demoted}, {event.claim_expired})
    GROUP BY run_id, claim_seq
), released AS (
    -- n_later: how many losses followed the release (0: none)
    SELECT c.run_id, c.claim_seq, c.release_event, c.release_seq, c.ttl_s,
           c.expired_ts_ns, c.accepted_ts_ns, coalesce(x.n_later, 0) AS n_later,
           x.first_later_seq, coalesce(x.n_relaxation, 0) AS n_relaxation,
           coalesce(x.n_expiry, 0) AS n_expiry, coalesce(x.n_other, 0) AS n_other,
           x.harm_seqs
    FROM c
    LEFT JOIN released_losses x ON x.run_id = c.run_id AND x.claim_seq = c.claim_seq
    WHERE c.release_event IN ({event.claim_demoted}, {event.claim_expired})
), lit_soft AS (
    -- LIT_soft_order: each loss of a soft_priority instance's leading block while in force;
    -- labelled harm exactly when a lower-priority evictable block existed (docs/design.md §3)
    SELECT l.run_id, l.seq, l.claim_seq, l.label
    FROM loss_claims l
    WHERE l.protection_mode = {mode.soft_priority} AND l.accepted_seq < l.seq
      AND (l.release_seq IS NULL OR l.release_seq > l.seq) AND l.position < l.threshold_blocks
      AND l.label <> {label.unknown}
), lit_value AS (
    -- LIT_thresholded_value: a loss that broke the predicate of a materialized instance in
    -- force (value lost: the claim is harmed and loses all its value, though other blocks may
    -- survive), or one beyond the threshold that left it intact (no value lost by it)
    -- NOTE: a loss whose prefix came back before its step ended is eviction, not a break
    SELECT l.run_id, l.seq, l.claim_seq, l.label = {label.harm} AS broke,
           coalesce(CASE WHEN l.label = {label.harm}
                         THEN x.outcome = {claim_outcome.harmed} AND x.value_lost = x.value
                              AND x.first_harm_seq <= l.seq
                         ELSE NOT (x.outcome = {claim_outcome.harmed} AND x.first_harm_seq = l.seq) END,
                    false) AS ok
    FROM loss_claims l
    JOIN claims x ON x.run_id = l.run_id AND x.claim_seq = l.claim_seq
    WHERE l.materialized_seq < l.seq AND l.accepted_seq < l.seq
      AND (l.release_seq IS NULL OR l.release_seq > l.seq)
      AND x.protection_mode IN (SELECT mode FROM kv_modes WHERE residency)
      AND ((l.label = {label.harm} AND l.breaks_predicate AND x.positions_bound > 1)
           OR (l.label = {label.eviction} AND NOT l.breaks_predicate
               AND l.position >= l.threshold_blocks))
), lit_unmat AS (
    -- LIT_materialization_failure: accepted instances whose predicate never held in force
    SELECT x.run_id, x.claim_seq, x.accepted_seq,
           [v FOR v IN [x.first_harm_seq, x.reported_materialized_seq] IF v IS NOT NULL]
           || CASE WHEN x.outcome = {claim_outcome.preserved} THEN [x.accepted_seq] ELSE []::BIGINT[] END
               AS bad_seqs
    FROM claims x
    WHERE x.accepted_seq IS NOT NULL AND x.materialized_seq IS NULL
      AND x.outcome <> {claim_outcome.unknown}
), cached AS (
    -- L7: requests whose num_cached_tokens can be compared with the trace
    SELECT run_id, list(finished_seq ORDER BY finished_seq) AS seqs, count(*) AS n
    FROM requests
    WHERE num_cached_tokens IS NOT NULL AND reconstructed_cached_tokens IS NOT NULL
      -- NOTE: 0 reported and 0 rebuilt compares nothing: no vacuous pass
      AND (num_cached_tokens > 0 OR reconstructed_cached_tokens > 0)
    GROUP BY run_id
), pinned_losses AS (
    -- INV_no_protected_loss's situation: the losses that happened while a pinning instance
    -- was in force (accepted at or before the loss, not released at or before it: the pass
    -- counts acceptances and releases in seq order, labels.pinned_in_force)
    SELECT run_id, count(*) AS n FROM kv_losses WHERE pinned_in_force
    GROUP BY run_id
), chunked AS (
    -- L_chunking: each admitted request whose allocations span more than one scheduler step
    SELECT b.run_id, b.request_id, count(DISTINCT b.step) AS n_steps
    FROM kv_request_blocks b
    WHERE b.step IS NOT NULL AND b.n_allocated > 0
    GROUP BY b.run_id, b.request_id
    HAVING count(DISTINCT b.step) > 1
), chunked_adm AS (
    SELECT f.run_id, f.seq, f.request_id, f.required_blocks, f.runtime_required_blocks,
           ch.n_steps
    FROM feasibility f
    JOIN chunked ch ON ch.run_id = f.run_id AND ch.request_id = f.request_id
    WHERE f.event = {event.request_admitted}
), unrebuilt AS (
    -- deferrals and refusals whose feasibility the trace cannot rebuild (no prompt size, no
    -- allocation: the need is unknown); the checks that judge them are unknown, never a
    -- verdict taken from the runtime's figures -- self-contained block
    SELECT run_id, list(seq ORDER BY seq) AS seqs
    FROM feasibility
    WHERE event IN ({event.request_deferred}, {event.request_refused}) AND feasible IS NULL
    GROUP BY run_id
), last_enforcement AS (
    -- the last event of each run that bears on enforcement: after a hook failure, a check
    -- that needs in-engine evidence cannot pass if any of these follow it (block_evicted:
    -- the seqs of `losses`, whose other rows are cache_reset seqs)
    SELECT run_id, max(seq) AS seq
    FROM (SELECT run_id, seq FROM kv_stage_events
          WHERE event IN ({event.cache_reset}, {event.request_admitted}, {event.request_deferred},
                          {event.request_refused}, {event.request_preempted}, {event.reuse_denied},
                          {event.claim_accepted}, {event.claim_rejected}, {event.claim_demoted}, {event.claim_expired},
                          {event.claim_released}, {event.claim_harmed}, {event.claim_materialized})
          UNION ALL
          SELECT run_id, max(seq) FROM losses GROUP BY run_id)
    GROUP BY run_id
), raw AS (
    -- Each check: exercised (its situation occurred), extra failing seqs beyond findings,
    -- the seqs that show what was exercised, and a detail line for a pass.
    -- L1: no accepted claim -> no harm -------------------------------------------------------
    SELECT r.run_id, {check.L1} AS check_name,
           u.n IS NOT NULL
           OR EXISTS (SELECT 1 FROM kv_claim_refs e WHERE e.run_id = r.run_id
                      AND e.event = {event.claim_harmed}) AS exercised,
           u.harm_seqs AS fail_seqs,
           -- the 10 smallest seqs, ascending
           u.first_seqs AS pass_seqs,
           format('{} loss(es) without an accepted claim, none labelled harm', coalesce(u.n, 0))
               AS pass_detail,
           NULL::BIGINT[] AS pass_claim_seqs
    FROM kv_runs r
    LEFT JOIN uncovered u ON u.run_id = r.run_id
    UNION ALL
    -- L2: write no-admit serves the active request, yet residents are still evicted ----------
    SELECT r.run_id, {check.L2},
           EXISTS (SELECT 1 FROM denied d WHERE d.run_id = r.run_id AND d.served
                     AND len(coalesce(d.lost, [])) > 0),
           (SELECT nullif(flatten(list(
                       CASE WHEN d.not_served
                            THEN [v FOR v IN [d.reuse_denied_seq, d.refused_seq, d.finished_seq]
                                  IF v IS NOT NULL]
                            ELSE []::BIGINT[] END || coalesce(d.cached_after, []::BIGINT[]))),
                   []::BIGINT[])
            FROM denied d WHERE d.run_id = r.run_id),
           (SELECT flatten(list([d.reuse_denied_seq, d.finished_seq, d.lost[1]]))
            FROM denied d WHERE d.run_id = r.run_id AND d.served AND len(coalesce(d.lost, [])) > 0),
           (SELECT format('{} write-no-admit request(s) served while {} resident block(s) were '
                          'evicted', count(*), sum(len(d.lost)))
            FROM denied d WHERE d.run_id = r.run_id AND d.served AND len(coalesce(d.lost, [])) > 0),
           NULL
    FROM kv_runs r
    UNION ALL
    -- L3: an accepted hard claim turns infeasibility into a refusal naming it; no block lost --
    SELECT r.run_id, {check.L3},
           r.enforcing AND EXISTS (SELECT 1 FROM hard_conflicts h WHERE h.run_id = r.run_id),
           CASE WHEN r.enforcing THEN nullif(
               coalesce((SELECT list(x.first_harm_seq) FROM claims x WHERE x.run_id = r.run_id
                           AND x.protection_mode = {mode.hard_protected} AND x.outcome = {claim_outcome.harmed}),
                        []::BIGINT[])
               || coalesce((SELECT list(f.seq ORDER BY f.seq) FROM feasibility f
                            WHERE f.run_id = r.run_id AND NOT f.feasible
                              AND f.event IN ({event.request_deferred}, {event.request_refused})
                              AND NOT EXISTS (
                                  SELECT 1 FROM kv_claim_refs x JOIN c
                                    ON c.run_id = x.run_id AND c.claim_seq = x.claim_seq
                                  WHERE x.run_id = f.run_id AND x.seq = f.seq
                                    AND c.protection_mode = {mode.hard_protected})),
                           []::BIGINT[]), []::BIGINT[]) END,
           (SELECT list(DISTINCT h.seq ORDER BY h.seq) FROM hard_conflicts h
            WHERE h.run_id = r.run_id),
           (SELECT format('{} infeasible decision(s) facing a hard claim: {} refusal(s), '
                          '{} deferral(s) naming it; {} hard-claim block(s) lost',
                          count(DISTINCT h.seq),
                          count(DISTINCT h.seq) FILTER (WHERE h.event = {event.request_refused}),
                          count(DISTINCT h.seq) FILTER (WHERE h.event = {event.request_deferred}),
                          (SELECT coalesce(sum(x.blocks_lost_harm + x.blocks_lost_eviction), 0)
                           FROM claims x WHERE x.run_id = r.run_id
                             AND x.protection_mode = {mode.hard_protected}))
            FROM hard_conflicts h WHERE h.run_id = r.run_id),
           (SELECT list(DISTINCT h.claim_seq) FROM hard_conflicts h WHERE h.run_id = r.run_id)
    FROM kv_runs r
    UNION ALL
    -- L4 / L5: a demotion (expiry) strictly precedes every later loss of that instance --------
    SELECT r.run_id, t.check_name,
           EXISTS (SELECT 1 FROM released x WHERE x.run_id = r.run_id AND x.release_event = t.ev
                     AND x.n_later > 0),
           nullif(coalesce((SELECT flatten(list(coalesce(x.harm_seqs, []::BIGINT[])
                                               || CASE WHEN t.ev = {event.claim_expired}
                                                        AND x.ttl_s IS NOT NULL
                                                        AND x.expired_ts_ns < x.accepted_ts_ns
                                                            + CAST(x.ttl_s * 1e9 AS BIGINT)
                                                       THEN [x.release_seq]
                                                       ELSE []::BIGINT[] END
                                         ORDER BY x.claim_seq))
                            FROM released x WHERE x.run_id = r.run_id
                              AND x.release_event = t.ev), []::BIGINT[]), []::BIGINT[]),
           -- NOTE: ordered by instance: `released` is an aggregate, its row order is arbitrary
           (SELECT flatten(list([x.release_seq, x.first_later_seq] ORDER BY x.claim_seq))
            FROM released x WHERE x.run_id = r.run_id AND x.release_event = t.ev
              AND x.n_later > 0),
           (SELECT format('{} {} claim instance(s) later lost {} block(s): {} labelled {}, {} '
                          'otherwise, none harm', count(*), t.ev,
                          sum(x.n_later),
                          sum(CASE WHEN t.ev = {event.claim_expired} THEN x.n_expiry
                                   ELSE x.n_relaxation END), t.label, sum(x.n_other))
            FROM released x WHERE x.run_id = r.run_id AND x.release_event = t.ev
              AND x.n_later > 0),
           (SELECT list(x.claim_seq ORDER BY x.claim_seq) FROM released x
            WHERE x.run_id = r.run_id AND x.release_event = t.ev AND x.n_later > 0)
    FROM kv_runs r,
         (VALUES ({check.L4}, {event.claim_demoted}, {label.relaxation}),
                 ({check.L5}, {event.claim_expired}, {label.expiry})) t(check_name, ev, label)
    UNION ALL
    -- L6: surviving block count is not the predicate ----------------------------------------
    SELECT r.run_id, {check.L6},
           EXISTS (SELECT 1 FROM kv_claim_refs e WHERE e.run_id = r.run_id
                     AND e.event = {event.claim_materialized})
           OR EXISTS (SELECT 1 FROM claims x WHERE x.run_id = r.run_id
                        AND x.accepted_seq IS NOT NULL AND x.materialized_seq IS NULL),
           (SELECT nullif(list(x.reported_harm_seq), []::BIGINT[]) FROM claims x
            WHERE x.run_id = r.run_id
              AND x.materialized_seq IS NULL AND x.reported_harm_seq IS NOT NULL),
           (SELECT flatten(list([v FOR v IN [x.accepted_seq, x.materialized_seq,
                                             x.reported_materialized_seq] IF v IS NOT NULL]))
            FROM claims x WHERE x.run_id = r.run_id AND x.accepted_seq IS NOT NULL),
           (SELECT format('{} accepted claim instance(s): {} materialized (all leading '
                          'positions resident), {} never', count(*), count(x.materialized_seq),
                          count(*) - count(x.materialized_seq))
            FROM claims x WHERE x.run_id = r.run_id AND x.accepted_seq IS NOT NULL),
           (SELECT list(x.claim_seq) FROM claims x
            WHERE x.run_id = r.run_id AND x.accepted_seq IS NOT NULL)
    FROM kv_runs r
    UNION ALL
    -- L7: the outcome reconstructed from the trace equals what the runtime reported ----------
    SELECT r.run_id, {check.L7},
           EXISTS (SELECT 1 FROM kv_stage_events e WHERE e.run_id = r.run_id
                     AND e.event IN ({event.claim_harmed}, {event.claim_materialized}, {event.request_refused}))
           OR EXISTS (SELECT 1 FROM claims x WHERE x.run_id = r.run_id
                        AND x.outcome = {claim_outcome.harmed})
           OR ch.n IS NOT NULL,
           NULL,
           coalesce((SELECT flatten(list([v FOR v IN [x.first_harm_seq, x.reported_harm_seq,
                                                      x.materialized_seq,
                                                      x.reported_materialized_seq]
                                          IF v IS NOT NULL]))
                     FROM claims x WHERE x.run_id = r.run_id), []::BIGINT[])
           || coalesce(ch.seqs, []::BIGINT[]),
           format('every runtime report (claim_harmed, claim_materialized, refusals) agrees with '
                  'the reconstruction, in order; {} request(s): vLLM''s num_cached_tokens equals '
                  'the prefix hit in the trace', coalesce(ch.n, 0)),
           (SELECT list(x.claim_seq) FROM claims x WHERE x.run_id = r.run_id
              AND (x.reported_harm_seq IS NOT NULL OR x.reported_materialized_seq IS NOT NULL
                   OR x.outcome = {claim_outcome.harmed}))
    FROM kv_runs r LEFT JOIN cached ch ON ch.run_id = r.run_id
    UNION ALL
    -- invariants ------------------------------------------------------------------------------
    SELECT r.run_id, {check.INV_no_harm_without_acceptance},
           EXISTS (SELECT 1 FROM kv_claim_refs e WHERE e.run_id = r.run_id
                     AND e.event = {event.claim_harmed})
           OR EXISTS (SELECT 1 FROM loss_claims x WHERE x.run_id = r.run_id
                        AND x.label = {label.harm}),
           NULL,
           (SELECT list(x.seq ORDER BY x.seq) FROM kv_claim_refs x
            WHERE x.run_id = r.run_id AND x.event = {event.claim_harmed}),
           'every harm (reported or reconstructed) follows its claim''s acceptance',
           (SELECT list(DISTINCT x.claim_seq) FROM kv_claim_refs x
            WHERE x.run_id = r.run_id AND x.event = {event.claim_harmed})
    FROM kv_runs r
    UNION ALL
    SELECT r.run_id, {check.INV_release_precedes_loss},
           -- a loss of a released instance's content (before or after its release)
           EXISTS (SELECT 1 FROM loss_claims x WHERE x.run_id = r.run_id
                     AND x.release_seq IS NOT NULL),
           NULL,
           (SELECT list(c.release_seq ORDER BY c.release_seq) FROM c
            WHERE c.run_id = r.run_id AND c.release_seq IS NOT NULL),
           'every relaxation/expiry loss is strictly after its release; no harm before it',
           (SELECT list(c.claim_seq) FROM c
            WHERE c.run_id = r.run_id AND c.release_seq IS NOT NULL)
    FROM kv_runs r
    UNION ALL
    SELECT r.run_id, {check.INV_refusal_names_protected_claim},
           EXISTS (SELECT 1 FROM kv_stage_events e WHERE e.run_id = r.run_id
                     AND e.event = {event.request_refused}),
           NULL,
           (SELECT list(e.seq ORDER BY e.seq) FROM kv_stage_events e
            WHERE e.run_id = r.run_id AND e.event = {event.request_refused}),
           'every refusal names in-force, materialized, protected claims',
           (SELECT list(DISTINCT x.claim_seq) FROM kv_claim_refs x
            WHERE x.run_id = r.run_id AND x.event = {event.request_refused})
    FROM kv_runs r
    UNION ALL
    SELECT r.run_id, {check.INV_no_protected_loss},
           r.enforcing AND pl.run_id IS NOT NULL,
           NULL,
           (SELECT list(c.accepted_seq ORDER BY c.accepted_seq) FROM c
            WHERE c.run_id = r.run_id AND c.pinned_mode AND c.accepted_seq IS NOT NULL),
           format('{} block loss(es) while a pinning claim was in force; none of its blocks',
                  pl.n),
           (SELECT list(c.claim_seq) FROM c
            WHERE c.run_id = r.run_id AND c.pinned_mode AND c.accepted_seq IS NOT NULL)
    FROM kv_runs r LEFT JOIN pinned_losses pl ON pl.run_id = r.run_id
    UNION ALL
    SELECT r.run_id, {check.INV_feasible_admission},
           r.enforcing AND EXISTS (SELECT 1 FROM feasibility f WHERE f.run_id = r.run_id
                                     AND f.event = {event.request_admitted}
                                     AND f.protected_blocks > 0),
           NULL,
           (SELECT list(f.seq ORDER BY f.seq) FROM feasibility f
            WHERE f.run_id = r.run_id AND f.event = {event.request_admitted}
              AND f.protected_blocks > 0),
           'protected + active live <= usable (rebuilt from the trace) at every admission '
           'under an enforcing policy while claims protected blocks',
           NULL
    FROM kv_runs r
    UNION ALL
    -- feasibility, chunking and lowering litmus (issue 24 items 3-5) -- self-contained block
    SELECT r.run_id, {check.L_feasibility},
           r.enforcing AND EXISTS (
               SELECT 1 FROM feasibility f WHERE f.run_id = r.run_id
                 AND f.event IN ({event.request_admitted}, {event.request_deferred}, {event.request_refused})
                 AND f.protected_blocks > 0 AND f.live_blocks > 0),
           NULL,
           (SELECT list(f.seq ORDER BY f.seq) FROM feasibility f WHERE f.run_id = r.run_id
              AND f.event IN ({event.request_admitted}, {event.request_deferred}, {event.request_refused})
              AND f.protected_blocks > 0 AND f.live_blocks > 0),
           (SELECT format('{} decision(s) with protected and live KV: every one judged on '
                          'protected + active live <= usable, rebuilt, and the runtime''s '
                          'figures agree', count(*))
            FROM feasibility f WHERE f.run_id = r.run_id
              AND f.event IN ({event.request_admitted}, {event.request_deferred}, {event.request_refused})
              AND f.protected_blocks > 0 AND f.live_blocks > 0),
           (SELECT list(DISTINCT u.cs) FROM feasibility f, unnest(f.protected_claim_seqs) u(cs)
            WHERE f.run_id = r.run_id AND f.protected_blocks > 0 AND f.live_blocks > 0)
    FROM kv_runs r
    UNION ALL
    SELECT r.run_id, {check.L_chunking},
           EXISTS (SELECT 1 FROM chunked_adm x WHERE x.run_id = r.run_id),
           NULL,
           (SELECT list(x.seq ORDER BY x.seq) FROM chunked_adm x WHERE x.run_id = r.run_id),
           (SELECT format('{} request(s) allocated over 2 or more scheduler steps: each '
                          'admission judged on the full prompt less hits ({} block(s) in all)',
                          count(*), sum(x.required_blocks))
            FROM chunked_adm x WHERE x.run_id = r.run_id),
           NULL
    FROM kv_runs r
    UNION ALL
    SELECT r.run_id, {check.L_lowering},
           EXISTS (SELECT 1 FROM kv_manifest_lowering ml WHERE ml.run_id = r.run_id),
           NULL, []::BIGINT[],
           (SELECT format('{} mode(s) declared in the manifest, none contradicted by the run''s '
                          'evidence', count(*))
            FROM kv_manifest_lowering ml WHERE ml.run_id = r.run_id),
           NULL
    FROM kv_runs r
    UNION ALL
    -- only the owner or the operator releases (verified releases; findings fail it) ---------
    SELECT r.run_id, {check.INV_release_by_owner},
           -- NOTE: a release the format cannot verify (no released_by) does not exercise it
           EXISTS (SELECT 1 FROM kv_lifecycle_ends x WHERE x.run_id = r.run_id
                     AND x.event = {event.claim_released} AND x.verified),
           NULL,
           (SELECT list(x.seq ORDER BY x.seq) FROM kv_lifecycle_ends x
            WHERE x.run_id = r.run_id AND x.event = {event.claim_released}),
           (SELECT format('{} release(s): by the claim''s own tenant or the operator ({} '
                          'unverified: the format records no released_by)', count(*),
                          count(*) FILTER (WHERE NOT x.verified))
            FROM kv_lifecycle_ends x
            WHERE x.run_id = r.run_id AND x.event = {event.claim_released}),
           (SELECT list(DISTINCT x.claim_seq) FROM kv_lifecycle_ends x
            WHERE x.run_id = r.run_id AND x.event = {event.claim_released})
    FROM kv_runs r
    -- litmus: soft order, thresholded value, materialization failure (self-contained) -------
    UNION ALL
    SELECT r.run_id, {check.LIT_soft_order},
           r.enforcing AND EXISTS (SELECT 1 FROM lit_soft x WHERE x.run_id = r.run_id),
           CASE WHEN r.enforcing THEN (SELECT nullif(list(x.seq ORDER BY x.seq)
                                                     FILTER (WHERE x.label = {label.harm}),
                                                     []::BIGINT[])
                                       FROM lit_soft x WHERE x.run_id = r.run_id) END,
           (SELECT list(x.seq ORDER BY x.seq) FROM lit_soft x WHERE x.run_id = r.run_id),
           (SELECT format('{} loss(es) of soft_priority claims in force, none while a '
                          'lower-priority evictable block existed', count(*))
            FROM lit_soft x WHERE x.run_id = r.run_id),
           (SELECT list(DISTINCT x.claim_seq) FROM lit_soft x WHERE x.run_id = r.run_id)
    FROM kv_runs r
    UNION ALL
    SELECT r.run_id, {check.LIT_thresholded_value},
           EXISTS (SELECT 1 FROM lit_value x WHERE x.run_id = r.run_id),
           (SELECT nullif(list(x.seq ORDER BY x.seq) FILTER (WHERE NOT x.ok), []::BIGINT[])
            FROM lit_value x WHERE x.run_id = r.run_id),
           (SELECT list(x.seq ORDER BY x.seq) FROM lit_value x WHERE x.run_id = r.run_id),
           (SELECT format('{} loss(es): value lost exactly where the leading prefix of the '
                          'threshold broke ({} with other blocks surviving), kept where it '
                          'held ({})', count(*), count(*) FILTER (WHERE x.broke),
                          count(*) FILTER (WHERE NOT x.broke))
            FROM lit_value x WHERE x.run_id = r.run_id),
           (SELECT list(DISTINCT x.claim_seq) FROM lit_value x WHERE x.run_id = r.run_id)
    FROM kv_runs r
    UNION ALL
    SELECT r.run_id, {check.LIT_materialization_failure},
           EXISTS (SELECT 1 FROM lit_unmat x WHERE x.run_id = r.run_id),
           (SELECT nullif(flatten(list(x.bad_seqs)), []::BIGINT[])
            FROM lit_unmat x WHERE x.run_id = r.run_id),
           (SELECT list(x.accepted_seq ORDER BY x.accepted_seq) FROM lit_unmat x
            WHERE x.run_id = r.run_id),
           (SELECT format('{} accepted claim(s) never materialized: none harmed, preserved or '
                          'reported materialized', count(*))
            FROM lit_unmat x WHERE x.run_id = r.run_id),
           (SELECT list(x.claim_seq) FROM lit_unmat x WHERE x.run_id = r.run_id)
    FROM kv_runs r
), judged AS (
    SELECT raw.*, k.ord, k.title, k.needs, k.needs_engine, k.judges_enforcement, r.evidence,
           r.has_hole,
           r.unknown_from_seq, r.hook_failed_seq, r.hook_failed_hook, r.hook_failed_error,
           le.seq AS last_enforcement_seq,
           -- every failing seq: the failing findings' seqs and the check's own
           list_sort(list_distinct(coalesce(ff.seqs, []::BIGINT[])
                                   || coalesce(raw.fail_seqs, []::BIGINT[]))) AS all_fail_seqs,
           ff.claim_seqs AS fail_claim_seqs,
           ff.kinds AS fail_kinds,
           ff.run_id IS NOT NULL OR len(coalesce(raw.fail_seqs, []::BIGINT[])) > 0 AS failing
    FROM raw
    JOIN kv_checks k ON k."check" = raw.check_name
    JOIN kv_runs r ON r.run_id = raw.run_id
    LEFT JOIN last_enforcement le ON le.run_id = raw.run_id
    LEFT JOIN failed ff ON ff.run_id = raw.run_id AND ff.check_name = raw.check_name
), decided AS (
    SELECT j.*, ub.seqs AS unrebuilt_seqs,
           format('hook {} failed at seq {} ({}): enforcement from there on is unknown',
                  coalesce(j.hook_failed_hook, '?'), j.hook_failed_seq,
                  coalesce(j.hook_failed_error, 'unknown error')) AS hook_note,
           CASE
               WHEN j.evidence = {evidence.observed} AND j.needs_engine THEN {evidence.observed}
               WHEN j.failing AND (j.hook_failed_seq IS NULL
                                   OR list_min(j.all_fail_seqs) < j.hook_failed_seq
                                   -- a failing condition without a seq is not after the hook
                                   OR len(j.all_fail_seqs) = 0) THEN {verdict.fail}
               WHEN j.failing THEN 'fail_after_hook'
               WHEN j.has_hole THEN {severity.hole}
               WHEN j.judges_enforcement AND j.exercised AND j.hook_failed_seq IS NOT NULL
                    AND (coalesce(list_max(j.pass_seqs), j.hook_failed_seq) >= j.hook_failed_seq
                         OR j.last_enforcement_seq > j.hook_failed_seq)
                   THEN 'after_hook'
               WHEN j.check_name IN ({check.L3}, {check.INV_refusal_names_protected_claim}, {check.L_feasibility})
                    AND ub.seqs IS NOT NULL THEN 'unrebuilt'
               WHEN NOT j.exercised THEN {verdict.not_exercised}
               ELSE {verdict.pass}
           END AS why
    FROM judged j
    LEFT JOIN unrebuilt ub ON ub.run_id = j.run_id
), evidence_claim_seqs AS (
    -- the claim instances each verdict's evidence is about, one row each
    -- NOTE: an equality join, not list_contains per claim: that was quadratic in the claims
    SELECT DISTINCT run_id, check_name,
           unnest(CASE WHEN why IN ({verdict.fail}, 'fail_after_hook') THEN fail_claim_seqs
                       WHEN why IN ({verdict.pass}, {severity.hole}, 'after_hook') THEN pass_claim_seqs
                  END) AS claim_seq
    FROM decided
), evidence_claims AS (
    SELECT e.run_id, e.check_name,
           list({'claim_id': f.claim_id, 'claim_seq': f.claim_seq} ORDER BY f.claim_seq)
               AS claims
    FROM evidence_claim_seqs e
    JOIN kv_claim_facts f ON f.run_id = e.run_id AND f.claim_seq = e.claim_seq
    GROUP BY e.run_id, e.check_name
)
SELECT
    d.run_id, d.check_name AS "check", d.title,
    CASE d.why WHEN {evidence.observed} THEN {verdict.not_exercised} WHEN {verdict.fail} THEN {verdict.fail}
               WHEN 'fail_after_hook' THEN {verdict.unknown} WHEN {severity.hole} THEN {verdict.unknown}
               WHEN 'after_hook' THEN {verdict.unknown} WHEN 'unrebuilt' THEN {verdict.unknown}
               WHEN {verdict.not_exercised} THEN {verdict.not_exercised}
               ELSE {verdict.pass} END AS verdict,
    CASE WHEN d.why IN ({verdict.fail}, 'fail_after_hook') THEN d.all_fail_seqs
         WHEN d.why = 'after_hook' THEN [d.hook_failed_seq]
         WHEN d.why = 'unrebuilt' THEN d.unrebuilt_seqs
         WHEN d.why IN ({evidence.observed}, {verdict.not_exercised}) THEN []::BIGINT[]
         ELSE coalesce(d.pass_seqs, []::BIGINT[])
    END AS evidence_seqs,
    CASE d.why
        WHEN {evidence.observed} THEN 'not exercised: an observed run (stock-vLLM listener) holds no '
                             'in-engine requests, admissions or arbiter decisions; this check '
                             'needs ' || d.needs
        WHEN {verdict.fail} THEN coalesce('failing findings: ' || d.fail_kinds
                                  || CASE WHEN len(coalesce(d.fail_seqs, [])) > 0
                                          THEN '; and the trace contradicts the rule '
                                               || '(see evidence seqs)' ELSE '' END,
                                  'the trace contradicts the rule (see evidence seqs)')
        WHEN 'fail_after_hook' THEN d.hook_note || '; the failing evidence lies after it'
        WHEN {severity.hole} THEN CASE WHEN d.exercised
                              THEN 'no violation seen, but the run has a hole from seq '
                              ELSE 'not exercised in the events held, but the run has a hole '
                                   || 'from seq ' END
                         || coalesce(d.unknown_from_seq::VARCHAR, 'its truncation')
        WHEN 'after_hook' THEN d.hook_note || '; evidence this check judges lies after it'
        WHEN 'unrebuilt' THEN 'the trace does not show the need of the request(s) deferred or '
                              || 'refused at the evidence seqs (no prompt size, no allocation): '
                              || 'their feasibility cannot be rebuilt, and the runtime''s '
                              || 'figures are not evidence'
        WHEN {verdict.not_exercised} THEN 'not exercised: needs ' || d.needs
        ELSE coalesce(d.pass_detail, 'no violation')
             || CASE WHEN d.hook_failed_seq IS NOT NULL
                     THEN ' (' || d.hook_note || '; all evidence precedes it)' ELSE '' END
    END AS detail,
    d.needs,
    -- the claim instances the evidence is about: (claim_id, claim_seq), by claim_seq
    coalesce(ec.claims, []) AS evidence_claims
FROM decided d
LEFT JOIN evidence_claims ec ON ec.run_id = d.run_id AND ec.check_name = d.check_name
ORDER BY d.run_id, d.ord;

-- NOTE: the `lowering` table (one row per run and mode) is built by 07_findings.sql, before
-- the findings that compare it with the manifest's claim.
