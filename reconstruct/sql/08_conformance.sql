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

-- Statement 1: each (run, check)'s situation, and the rows of its evidence: kv_check_rows.
-- Then, each in a statement of its own: the failing findings, and each aggregate of the
-- evidence per (run, check), bounded: failing seqs, exercised seqs, claim instances
-- (kv_check_finding_fails, kv_check_fail_seqs, kv_check_pass_seqs, kv_check_claims); those
-- joined to the situations: kv_check_evidence; the verdicts: conformance.
-- NOTE: one aggregate per statement, so that each one's relations are gone before the next
-- runs: the evidence aggregates in one statement ran at once (the exercised seqs' DISTINCT
-- beside the others') and did not fit 150MB at 100 M events; one at a time they fit 100MB.
-- kv_check_rows: rows of each (run, check), by `part`:
--   0: the check's situation: exercised (it occurred), pass_detail (the sentence of a pass);
--   1: a failing seq of its own (seq NULL: its failing condition holds without one);
--   2: a seq that shows what it exercised; 3: a claim instance it judged (claim_seq).
CREATE OR REPLACE TEMP TABLE kv_check_rows AS
WITH c AS NOT MATERIALIZED (
    SELECT * FROM kv_claim_facts
), uncovered_losses AS NOT MATERIALIZED (
    -- L1: the losses not covered by any claim accepted before them (uncovered), and those
    -- labelled harm that no claim accepted before them labels harm
    -- NOTE: the labelling pass marks each loss (kv_losses.covered / covered_harm) from its
    -- bound instances: no grouping of loss_claims, no join with the losses
    SELECT run_id, seq, synthetic, NOT covered AS uncovered,
           label = {label.harm} AND NOT covered_harm AS uncovered_harm
    FROM kv_losses
    WHERE NOT covered OR (label = {label.harm} AND NOT covered_harm)
), uncovered AS (
    -- per run: how many uncovered losses (NULL: none)
    SELECT run_id, nullif(count(*) FILTER (WHERE uncovered), 0) AS n
    FROM uncovered_losses
    GROUP BY run_id
), denied_cached AS NOT MATERIALIZED (
    -- the block_cached events of reuse-denied requests (the only block events this stage scans)
    SELECT e.run_id, e.request_id, e.seq
    FROM events e
    WHERE e.event = {event.block_cached}
      AND e.request_id IN (SELECT request_id FROM requests WHERE reuse_denied)
), denied_req AS (
    -- the reuse-denied requests and the end of each one's window (NULL: the run's end)
    SELECT run_id, request_id, reuse_denied_seq, finished_seq, refused_seq, outcome,
           coalesce(finished_seq, refused_seq) AS end_seq
    FROM requests WHERE reuse_denied
), denied_resident AS (
    -- the resident losses of the runs that have a reuse-denied request
    SELECT run_id, seq, by_request_id FROM losses
    WHERE was_resident AND run_id IN (SELECT run_id FROM denied_req)
), denied_upto AS (
    -- per such run and seq with a resident loss: how many resident losses up to it
    SELECT run_id, seq, (sum(count(*)) OVER (PARTITION BY run_id ORDER BY seq))::BIGINT AS upto
    FROM denied_resident GROUP BY run_id, seq
), denied_own AS (
    -- each request's own evictions, and how many of them lie in its window
    SELECT d.run_id, d.request_id, count(*) AS n, min(l.seq) AS first_seq,
           count(*) FILTER (WHERE l.seq > d.reuse_denied_seq
                              AND l.seq <= coalesce(d.end_seq, l.seq)) AS n_in
    FROM denied_req d
    JOIN denied_resident l ON l.run_id = d.run_id AND l.by_request_id = d.request_id
    GROUP BY ALL
), denied_window AS (
    -- the resident losses in (reuse_denied_seq, end_seq]: the count up to its end less the
    -- count up to its start, and the first one after its start if it is not past its end
    SELECT d.run_id, d.request_id,
           CASE WHEN d.reuse_denied_seq IS NOT NULL
                THEN greatest(coalesce(hi.upto, 0) - coalesce(lo.upto, 0), 0) ELSE 0 END AS n,
           CASE WHEN nx.seq <= coalesce(d.end_seq, nx.seq) THEN nx.seq END AS first_seq
    FROM denied_req d
    ASOF LEFT JOIN denied_upto lo ON lo.run_id = d.run_id AND lo.seq <= d.reuse_denied_seq
    ASOF LEFT JOIN denied_upto hi
        ON hi.run_id = d.run_id AND hi.seq <= coalesce(d.end_seq, 9223372036854775807)
    ASOF LEFT JOIN denied_upto nx ON nx.run_id = d.run_id AND nx.seq > d.reuse_denied_seq
), denied AS (
    -- L2: each reuse-denied request, whether it was served, and the residents lost while it
    -- ran (evicted by it, or after its denial up to its end): how many (n) and the first
    -- NOTE: a count and a min, not a list: a request never finished runs to the run's end
    -- NOTE: its own evictions plus its window's, less those in both; the window's counted by
    -- ASOF joins on running counts: a join of each request with every loss of its run took
    -- CPU in proportion to their product
    SELECT d.run_id, d.request_id, d.reuse_denied_seq, d.finished_seq, d.refused_seq,
           d.outcome IN ({request_outcome.served}, {request_outcome.deferred_then_served}) AS served,
           d.outcome NOT IN ({request_outcome.served}, {request_outcome.deferred_then_served}, {request_outcome.unknown}) AS not_served,
           {'n': coalesce(o.n, 0) + w.n - coalesce(o.n_in, 0),
            'first_seq': least(o.first_seq, w.first_seq)} AS lost
    FROM denied_req d
    JOIN denied_window w ON w.run_id = d.run_id AND w.request_id = d.request_id
    LEFT JOIN denied_own o ON o.run_id = d.run_id AND o.request_id = d.request_id
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
    -- NOTE: the protecting instances unnested and joined on their key: a join on the run with
    -- list_contains as its filter paired every infeasible decision with every instance of it
    SELECT f.run_id, f.seq, f.event, c.claim_seq
    FROM (SELECT run_id, seq, event, unnest(protected_claim_seqs) AS claim_seq
          FROM feasibility WHERE NOT feasible) f
    JOIN c ON c.run_id = f.run_id AND c.claim_seq = f.claim_seq
    WHERE c.protection_mode = {mode.hard_protected}
), released_losses AS (
    -- L4 / L5: per demoted (expired) instance, its losses after the release; from loss_claims
    -- alone (it carries release_seq/release_event), joined to the instances below
    SELECT run_id, claim_seq,
           count(*) FILTER (WHERE seq > release_seq) AS n_later,
           min(seq) FILTER (WHERE seq > release_seq) AS first_later_seq,
           count(*) FILTER (WHERE seq > release_seq AND label = {label.relaxation}) AS n_relaxation,
           count(*) FILTER (WHERE seq > release_seq AND label = {label.expiry}) AS n_expiry,
           count(*) FILTER (WHERE seq > release_seq
                              AND label NOT IN ({label.relaxation}, {label.expiry})) AS n_other
    FROM loss_claims
    WHERE release_event IN ({event.claim_demoted}, {event.claim_expired})
    GROUP BY run_id, claim_seq
), released AS (
    -- n_later: how many losses followed the release (0: none)
    SELECT c.run_id, c.claim_seq, c.release_event, c.release_seq, c.ttl_s,
           c.expired_ts_ns, c.accepted_ts_ns, coalesce(x.n_later, 0) AS n_later,
           x.first_later_seq, coalesce(x.n_relaxation, 0) AS n_relaxation,
           coalesce(x.n_expiry, 0) AS n_expiry, coalesce(x.n_other, 0) AS n_other
    FROM c
    LEFT JOIN released_losses x ON x.run_id = c.run_id AND x.claim_seq = c.claim_seq
    WHERE c.release_event IN ({event.claim_demoted}, {event.claim_expired})
), lit_soft AS NOT MATERIALIZED (
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
), cached AS NOT MATERIALIZED (
    -- L7: requests whose num_cached_tokens can be compared with the trace
    SELECT run_id, finished_seq
    FROM requests
    WHERE num_cached_tokens IS NOT NULL AND reconstructed_cached_tokens IS NOT NULL
      -- NOTE: 0 reported and 0 rebuilt compares nothing: no vacuous pass
      AND (num_cached_tokens > 0 OR reconstructed_cached_tokens > 0)
), cached_n AS (
    SELECT run_id, count(*) AS n FROM cached GROUP BY run_id
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
), run_loss_claims AS (
    -- per run aggregates that say whether each check's situation occurred and fill its pass
    -- detail, one LEFT JOIN each below
    -- NOTE: an aggregate per run, not EXISTS per run: a correlated EXISTS becomes a join that
    -- builds the subquery's rows (millions of loss_claims) in memory
    SELECT run_id, bool_or(label = {label.harm}) AS harm,
           bool_or(release_seq IS NOT NULL) AS released
    FROM loss_claims GROUP BY run_id
), run_refs AS (
    SELECT run_id, bool_or(event = {event.claim_harmed}) AS harmed,
           bool_or(event = {event.claim_materialized}) AS materialized
    FROM kv_claim_refs WHERE event IN ({event.claim_harmed}, {event.claim_materialized})
    GROUP BY run_id
), run_events AS (
    SELECT run_id, bool_or(event = {event.request_refused}) AS refused
    FROM kv_stage_events
    WHERE event IN ({event.claim_harmed}, {event.claim_materialized}, {event.request_refused})
    GROUP BY run_id
), run_claims AS (
    SELECT run_id, count(*) FILTER (WHERE accepted_seq IS NOT NULL) AS accepted,
           count(materialized_seq) FILTER (WHERE accepted_seq IS NOT NULL) AS materialized,
           bool_or(outcome = {claim_outcome.harmed}) AS harmed,
           coalesce(sum(blocks_lost_harm + blocks_lost_eviction)
                        FILTER (WHERE protection_mode = {mode.hard_protected}), 0) AS hard_lost
    FROM claims GROUP BY run_id
), run_denied AS (
    SELECT run_id, count(*) AS n, sum(lost.n) AS lost
    FROM denied WHERE served AND lost.n > 0 GROUP BY run_id
), run_hard AS (
    SELECT run_id, count(DISTINCT seq) AS n,
           count(DISTINCT seq) FILTER (WHERE event = {event.request_refused}) AS refused,
           count(DISTINCT seq) FILTER (WHERE event = {event.request_deferred}) AS deferred
    FROM hard_conflicts GROUP BY run_id
), run_released AS (
    SELECT run_id, release_event, count(*) AS n, sum(n_later) AS n_later,
           sum(n_expiry) AS n_expiry, sum(n_relaxation) AS n_relaxation, sum(n_other) AS n_other
    FROM released WHERE n_later > 0 GROUP BY run_id, release_event
), run_feasibility AS (
    SELECT run_id,
           bool_or(event = {event.request_admitted} AND protected_blocks > 0) AS admitted_protected,
           count(*) FILTER (WHERE event IN ({event.request_admitted}, {event.request_deferred}, {event.request_refused})
                              AND protected_blocks > 0 AND live_blocks > 0) AS decisions
    FROM feasibility GROUP BY run_id
), run_chunked AS (
    SELECT run_id, count(*) AS n, sum(required_blocks) AS blocks
    FROM chunked_adm GROUP BY run_id
), run_lowering AS (
    SELECT run_id, count(*) AS n FROM kv_manifest_lowering GROUP BY run_id
), run_releases AS (
    SELECT run_id, count(*) AS n, count(*) FILTER (WHERE NOT verified) AS unverified,
           bool_or(verified) AS verified
    FROM kv_lifecycle_ends WHERE event = {event.claim_released} GROUP BY run_id
), run_lit AS (
    SELECT run_id, sum(soft) AS soft, sum(value) AS value, sum(broke) AS broke,
           sum(unmat) AS unmat
    FROM (SELECT run_id, count(*) AS soft, 0 AS value, 0 AS broke, 0 AS unmat
          FROM lit_soft GROUP BY run_id
          UNION ALL
          SELECT run_id, 0, count(*), count(*) FILTER (WHERE broke), 0
          FROM lit_value GROUP BY run_id
          UNION ALL
          SELECT run_id, 0, 0, 0, count(*) FROM lit_unmat GROUP BY run_id)
    GROUP BY run_id
), raw AS (
    -- Each check: exercised (its situation occurred) and a detail line for a pass. The seqs
    -- and claim instances of its evidence are rows: fail_rows, pass_rows, claim_rows below.
    SELECT r.run_id, t.check_name,
           CASE t.check_name
               -- L1: no accepted claim -> no harm
               WHEN {check.L1} THEN u.n IS NOT NULL OR coalesce(rr.harmed, false)
               -- L2: write no-admit serves the active request, yet residents are still evicted
               WHEN {check.L2} THEN rd.n IS NOT NULL
               -- L3: an accepted hard claim turns infeasibility into a refusal naming it
               WHEN {check.L3} THEN r.enforcing AND rh.n IS NOT NULL
               -- L4 / L5: a demotion (expiry) strictly precedes every later loss of it
               WHEN {check.L4} THEN rl4.n IS NOT NULL
               WHEN {check.L5} THEN rl5.n IS NOT NULL
               -- L6: surviving block count is not the predicate
               WHEN {check.L6} THEN coalesce(rr.materialized, false)
                              OR coalesce(rc.accepted > rc.materialized, false)
               -- L7: the outcome reconstructed from the trace equals what the runtime reported
               WHEN {check.L7} THEN re.run_id IS NOT NULL OR coalesce(rc.harmed, false)
                              OR ch.n IS NOT NULL
               -- invariants
               WHEN {check.INV_no_harm_without_acceptance}
                   THEN coalesce(rr.harmed, false) OR coalesce(rlc.harm, false)
               -- a loss of a released instance's content (before or after its release)
               WHEN {check.INV_release_precedes_loss} THEN coalesce(rlc.released, false)
               WHEN {check.INV_refusal_names_protected_claim} THEN coalesce(re.refused, false)
               WHEN {check.INV_no_protected_loss} THEN r.enforcing AND pl.run_id IS NOT NULL
               WHEN {check.INV_feasible_admission}
                   THEN r.enforcing AND coalesce(rf.admitted_protected, false)
               -- feasibility, chunking and lowering litmus (issue 24 items 3-5)
               WHEN {check.L_feasibility} THEN r.enforcing AND coalesce(rf.decisions > 0, false)
               WHEN {check.L_chunking} THEN rch.n IS NOT NULL
               WHEN {check.L_lowering} THEN rlw.n IS NOT NULL
               -- NOTE: a release the format cannot verify (no released_by) does not exercise it
               WHEN {check.INV_release_by_owner} THEN coalesce(rre.verified, false)
               -- litmus: soft order, thresholded value, materialization failure
               WHEN {check.LIT_soft_order} THEN r.enforcing AND coalesce(lit.soft > 0, false)
               WHEN {check.LIT_thresholded_value} THEN coalesce(lit.value > 0, false)
               WHEN {check.LIT_materialization_failure} THEN coalesce(lit.unmat > 0, false)
           END AS exercised,
           CASE t.check_name
               WHEN {check.L1} THEN format('{} loss(es) without an accepted claim, none labelled harm',
                                     coalesce(u.n, 0))
               WHEN {check.L2} THEN format('{} write-no-admit request(s) served while {} resident '
                                     'block(s) were evicted', coalesce(rd.n, 0), rd.lost)
               WHEN {check.L3} THEN format('{} infeasible decision(s) facing a hard claim: {} '
                                     'refusal(s), {} deferral(s) naming it; {} hard-claim '
                                     'block(s) lost', coalesce(rh.n, 0), coalesce(rh.refused, 0),
                                     coalesce(rh.deferred, 0), coalesce(rc.hard_lost, 0))
               WHEN {check.L4} THEN format('{} {} claim instance(s) later lost {} block(s): {} '
                                     'labelled {}, {} otherwise, none harm', coalesce(rl4.n, 0),
                                     {event.claim_demoted}, rl4.n_later, rl4.n_relaxation,
                                     {label.relaxation}, rl4.n_other)
               WHEN {check.L5} THEN format('{} {} claim instance(s) later lost {} block(s): {} '
                                     'labelled {}, {} otherwise, none harm', coalesce(rl5.n, 0),
                                     {event.claim_expired}, rl5.n_later, rl5.n_expiry,
                                     {label.expiry}, rl5.n_other)
               WHEN {check.L6} THEN format('{} accepted claim instance(s): {} materialized (all '
                                     'leading positions resident), {} never',
                                     coalesce(rc.accepted, 0), coalesce(rc.materialized, 0),
                                     coalesce(rc.accepted - rc.materialized, 0))
               WHEN {check.L7} THEN format('every runtime report (claim_harmed, claim_materialized, '
                                     'refusals) agrees with the reconstruction, in order; {} '
                                     'request(s): vLLM''s num_cached_tokens equals the prefix '
                                     'hit in the trace', coalesce(ch.n, 0))
               WHEN {check.INV_no_harm_without_acceptance}
                   THEN 'every harm (reported or reconstructed) follows its claim''s acceptance'
               WHEN {check.INV_release_precedes_loss}
                   THEN 'every relaxation/expiry loss is strictly after its release; no harm '
                        'before it'
               WHEN {check.INV_refusal_names_protected_claim}
                   THEN 'every refusal names in-force, materialized, protected claims'
               WHEN {check.INV_no_protected_loss}
                   THEN format('{} block loss(es) while a pinning claim was in force; none of '
                               'its blocks', pl.n)
               WHEN {check.INV_feasible_admission}
                   THEN 'protected + active live <= usable (rebuilt from the trace) at every '
                        'admission under an enforcing policy while claims protected blocks'
               WHEN {check.L_feasibility}
                   THEN format('{} decision(s) with protected and live KV: every one judged on '
                               'protected + active live <= usable, rebuilt, and the runtime''s '
                               'figures agree', coalesce(rf.decisions, 0))
               WHEN {check.L_chunking}
                   THEN format('{} request(s) allocated over 2 or more scheduler steps: each '
                               'admission judged on the full prompt less hits ({} block(s) in '
                               'all)', coalesce(rch.n, 0), rch.blocks)
               WHEN {check.L_lowering}
                   THEN format('{} mode(s) declared in the manifest, none contradicted by the '
                               'run''s evidence', coalesce(rlw.n, 0))
               WHEN {check.INV_release_by_owner}
                   THEN format('{} release(s): by the claim''s own tenant or the operator ({} '
                               'unverified: the format records no released_by)',
                               coalesce(rre.n, 0), coalesce(rre.unverified, 0))
               WHEN {check.LIT_soft_order}
                   THEN format('{} loss(es) of soft_priority claims in force, none while a '
                               'lower-priority evictable block existed', coalesce(lit.soft, 0))
               WHEN {check.LIT_thresholded_value}
                   THEN format('{} loss(es): value lost exactly where the leading prefix of '
                               'the threshold broke ({} with other blocks surviving), kept '
                               'where it held ({})', coalesce(lit.value, 0),
                               coalesce(lit.broke, 0), coalesce(lit.value - lit.broke, 0))
               WHEN {check.LIT_materialization_failure}
                   THEN format('{} accepted claim(s) never materialized: none harmed, '
                               'preserved or reported materialized', coalesce(lit.unmat, 0))
           END AS pass_detail
    FROM kv_runs r
    CROSS JOIN (SELECT "check" AS check_name FROM kv_checks) t
    LEFT JOIN uncovered u ON u.run_id = r.run_id
    LEFT JOIN run_refs rr ON rr.run_id = r.run_id
    LEFT JOIN run_denied rd ON rd.run_id = r.run_id
    LEFT JOIN run_hard rh ON rh.run_id = r.run_id
    LEFT JOIN run_released rl4 ON rl4.run_id = r.run_id
                              AND rl4.release_event = {event.claim_demoted}
    LEFT JOIN run_released rl5 ON rl5.run_id = r.run_id
                              AND rl5.release_event = {event.claim_expired}
    LEFT JOIN run_claims rc ON rc.run_id = r.run_id
    LEFT JOIN run_events re ON re.run_id = r.run_id
    LEFT JOIN cached_n ch ON ch.run_id = r.run_id
    LEFT JOIN run_loss_claims rlc ON rlc.run_id = r.run_id
    LEFT JOIN pinned_losses pl ON pl.run_id = r.run_id
    LEFT JOIN run_feasibility rf ON rf.run_id = r.run_id
    LEFT JOIN run_chunked rch ON rch.run_id = r.run_id
    LEFT JOIN run_lowering rlw ON rlw.run_id = r.run_id
    LEFT JOIN run_releases rre ON rre.run_id = r.run_id
    LEFT JOIN run_lit lit ON lit.run_id = r.run_id
), fail_rows AS NOT MATERIALIZED (
    -- each check's own failing seqs beyond its failing findings, one row each (a seq may be
    -- NULL: the condition holds without one)
    SELECT run_id, {check.L1} AS check_name, seq FROM uncovered_losses WHERE uncovered_harm
    UNION ALL
    -- L2: the denied request was not served, or it cached a block after its denial
    SELECT d.run_id, {check.L2}, unnest([v FOR v IN [d.reuse_denied_seq, d.refused_seq,
                                               d.finished_seq] IF v IS NOT NULL])
    FROM denied d WHERE d.not_served
    UNION ALL
    SELECT d.run_id, {check.L2}, e.seq
    FROM denied d
    JOIN denied_cached e ON e.run_id = d.run_id AND e.request_id = d.request_id
                        AND e.seq > d.reuse_denied_seq
    UNION ALL
    -- L3 (enforcing runs): a hard claim harmed; an infeasible deferral/refusal naming no hard
    -- claim
    SELECT x.run_id, {check.L3}, x.first_harm_seq
    FROM claims x JOIN kv_runs r ON r.run_id = x.run_id
    WHERE r.enforcing AND x.protection_mode = {mode.hard_protected}
      AND x.outcome = {claim_outcome.harmed}
    UNION ALL
    SELECT f.run_id, {check.L3}, f.seq
    FROM feasibility f JOIN kv_runs r ON r.run_id = f.run_id
    WHERE r.enforcing AND NOT f.feasible
      AND f.event IN ({event.request_deferred}, {event.request_refused})
      AND NOT EXISTS (SELECT 1 FROM kv_claim_refs x JOIN c
                        ON c.run_id = x.run_id AND c.claim_seq = x.claim_seq
                      WHERE x.run_id = f.run_id AND x.seq = f.seq
                        AND c.protection_mode = {mode.hard_protected})
    UNION ALL
    -- L4 / L5: a harm row of a demoted (expired) instance, or an expiry before acceptance +
    -- ttl_s
    SELECT x.run_id, CASE x.release_event WHEN {event.claim_demoted} THEN {check.L4} ELSE {check.L5} END,
           l.seq
    FROM released x
    JOIN loss_claims l ON l.run_id = x.run_id AND l.claim_seq = x.claim_seq
    WHERE l.release_event IN ({event.claim_demoted}, {event.claim_expired})
      AND l.label = {label.harm}
    UNION ALL
    SELECT x.run_id, {check.L5}, x.release_seq
    FROM released x
    WHERE x.release_event = {event.claim_expired} AND x.ttl_s IS NOT NULL
      AND x.expired_ts_ns < x.accepted_ts_ns + CAST(x.ttl_s * 1e9 AS BIGINT)
    UNION ALL
    -- L6: a claim_harmed for a claim that never materialized
    SELECT x.run_id, {check.L6}, x.reported_harm_seq
    FROM claims x WHERE x.materialized_seq IS NULL AND x.reported_harm_seq IS NOT NULL
    UNION ALL
    SELECT x.run_id, {check.LIT_soft_order}, x.seq
    FROM lit_soft x JOIN kv_runs r ON r.run_id = x.run_id
    WHERE r.enforcing AND x.label = {label.harm}
    UNION ALL
    SELECT x.run_id, {check.LIT_thresholded_value}, x.seq FROM lit_value x WHERE NOT x.ok
    UNION ALL
    -- NOTE: bad_seqs: at most 3 per instance
    SELECT x.run_id, {check.LIT_materialization_failure}, unnest(x.bad_seqs) FROM lit_unmat x
), pass_rows AS (
    -- the seqs that show what each check exercised, one row each (a seq may repeat, but not
    -- L1's: kv_check_pass_seqs counts them without a DISTINCT)
    -- NOTE: L1's are one row per seq: a loss's seq is its block_evicted's (seqs are strictly
    -- increasing in a run), except a reset's synthetic losses, which share the reset's
    SELECT run_id, {check.L1} AS check_name, seq FROM uncovered_losses
    WHERE uncovered AND NOT synthetic
    UNION ALL
    SELECT DISTINCT run_id, {check.L1}, seq FROM uncovered_losses WHERE uncovered AND synthetic
    UNION ALL
    SELECT d.run_id, {check.L2}, unnest([d.reuse_denied_seq, d.finished_seq, d.lost.first_seq])
    FROM denied d WHERE d.served AND d.lost.n > 0
    UNION ALL
    SELECT run_id, {check.L3}, seq FROM hard_conflicts
    UNION ALL
    SELECT x.run_id, CASE x.release_event WHEN {event.claim_demoted} THEN {check.L4} ELSE {check.L5} END,
           unnest([x.release_seq, x.first_later_seq])
    FROM released x WHERE x.n_later > 0
    UNION ALL
    SELECT x.run_id, {check.L6}, unnest([x.accepted_seq, x.materialized_seq,
                                   x.reported_materialized_seq])
    FROM claims x WHERE x.accepted_seq IS NOT NULL
    UNION ALL
    SELECT x.run_id, {check.L7}, unnest([x.first_harm_seq, x.reported_harm_seq, x.materialized_seq,
                                   x.reported_materialized_seq])
    FROM claims x
    UNION ALL
    SELECT run_id, {check.L7}, finished_seq FROM cached
    UNION ALL
    SELECT run_id, {check.INV_no_harm_without_acceptance}, seq
    FROM kv_claim_refs WHERE event = {event.claim_harmed}
    UNION ALL
    SELECT run_id, {check.INV_release_precedes_loss}, release_seq FROM c
    UNION ALL
    SELECT run_id, {check.INV_refusal_names_protected_claim}, seq
    FROM kv_stage_events WHERE event = {event.request_refused}
    UNION ALL
    SELECT run_id, {check.INV_no_protected_loss}, accepted_seq FROM c WHERE pinned_mode
    UNION ALL
    SELECT run_id, {check.INV_feasible_admission}, seq
    FROM feasibility WHERE event = {event.request_admitted} AND protected_blocks > 0
    UNION ALL
    SELECT run_id, {check.L_feasibility}, seq
    FROM feasibility
    WHERE event IN ({event.request_admitted}, {event.request_deferred}, {event.request_refused})
      AND protected_blocks > 0 AND live_blocks > 0
    UNION ALL
    SELECT run_id, {check.L_chunking}, seq FROM chunked_adm
    UNION ALL
    SELECT run_id, {check.INV_release_by_owner}, seq
    FROM kv_lifecycle_ends WHERE event = {event.claim_released}
    UNION ALL
    SELECT run_id, {check.LIT_soft_order}, seq FROM lit_soft
    UNION ALL
    SELECT run_id, {check.LIT_thresholded_value}, seq FROM lit_value
    UNION ALL
    SELECT run_id, {check.LIT_materialization_failure}, accepted_seq FROM lit_unmat
), claim_rows AS (
    -- the claim instances each check judged (a pass's or an unknown's evidence), one row each
    SELECT run_id, {check.L3} AS check_name, claim_seq FROM hard_conflicts
    UNION ALL
    SELECT run_id, CASE release_event WHEN {event.claim_demoted} THEN {check.L4} ELSE {check.L5} END,
           claim_seq
    FROM released WHERE n_later > 0
    UNION ALL
    SELECT run_id, {check.L6}, claim_seq FROM claims WHERE accepted_seq IS NOT NULL
    UNION ALL
    SELECT run_id, {check.L7}, claim_seq FROM claims
    WHERE reported_harm_seq IS NOT NULL OR reported_materialized_seq IS NOT NULL
       OR outcome = {claim_outcome.harmed}
    UNION ALL
    SELECT run_id, {check.INV_no_harm_without_acceptance}, claim_seq
    FROM kv_claim_refs WHERE event = {event.claim_harmed}
    UNION ALL
    SELECT run_id, {check.INV_release_precedes_loss}, claim_seq FROM c WHERE release_seq IS NOT NULL
    UNION ALL
    SELECT run_id, {check.INV_refusal_names_protected_claim}, claim_seq
    FROM kv_claim_refs WHERE event = {event.request_refused}
    UNION ALL
    SELECT run_id, {check.INV_no_protected_loss}, claim_seq
    FROM c WHERE pinned_mode AND accepted_seq IS NOT NULL
    UNION ALL
    SELECT f.run_id, {check.L_feasibility}, u.cs
    FROM feasibility f, unnest(f.protected_claim_seqs) u(cs)
    WHERE f.protected_blocks > 0 AND f.live_blocks > 0
    UNION ALL
    SELECT run_id, {check.INV_release_by_owner}, claim_seq
    FROM kv_lifecycle_ends WHERE event = {event.claim_released}
    UNION ALL
    SELECT run_id, {check.LIT_soft_order}, claim_seq FROM lit_soft
    UNION ALL
    SELECT run_id, {check.LIT_thresholded_value}, claim_seq FROM lit_value
    UNION ALL
    SELECT run_id, {check.LIT_materialization_failure}, claim_seq FROM lit_unmat
)
SELECT run_id, check_name, 0 AS part, exercised, pass_detail, NULL::BIGINT AS seq,
       NULL::BIGINT AS claim_seq
FROM raw
UNION ALL
SELECT run_id, check_name, 1, NULL, NULL, seq, NULL FROM fail_rows
UNION ALL
SELECT run_id, check_name, 2, NULL, NULL, seq, NULL FROM pass_rows WHERE seq IS NOT NULL
UNION ALL
SELECT run_id, check_name, 3, NULL, NULL, NULL, claim_seq FROM claim_rows
WHERE claim_seq IS NOT NULL;

-- kv_check_finding_fails: the findings that fail each check, one row each
CREATE OR REPLACE TEMP TABLE kv_check_finding_fails AS
WITH fails AS (
    -- the finding kinds that fail each check
    -- NOTE: checks.Check.fails_on is the one list; core.stage_sql fills the marker with it
    SELECT * FROM (VALUES
        /*@KV_CHECK_FAILS@*/
    ) t(check_name, kind)
)
-- NOTE: a finding of severity info (the expected consequence of a policy that enforces no
-- claim) fails no check
SELECT f.check_name, k.run_id, k.seq, k.kind, k.claim_seq
FROM fails f JOIN findings k ON k.kind = f.kind
WHERE k.severity <> {severity.info};

-- kv_check_fail_seqs: per (run, check), its failing seqs (the failing findings' and its own,
-- each once): how many, the first, and the smallest /*@EVIDENCE_MAX@*/ ascending
-- NOTE: min(seq, n) keeps n values per group (a top-n), a list of every seq would hold them
-- all and cannot spill; the verdict reads the count and the first, never the list
CREATE OR REPLACE TEMP TABLE kv_check_fail_seqs AS
SELECT run_id, check_name, count(*) AS n, min(seq) AS first_seq,
       list_sort(min(seq, /*@EVIDENCE_MAX@*/), 'ASC') AS seqs
FROM (SELECT run_id, check_name, seq FROM kv_check_finding_fails WHERE seq IS NOT NULL
      UNION
      SELECT run_id, check_name, seq FROM kv_check_rows WHERE part = 1 AND seq IS NOT NULL)
GROUP BY run_id, check_name;

-- kv_check_pass_seqs: per (run, check), the seqs that show what it exercised, each once: how
-- many, the last, and the smallest /*@EVIDENCE_MAX@*/ ascending
-- NOTE: L1's rows, one per uncovered loss, are most rows of kv_check_rows and one row per
-- seq already: only the other checks' go through a DISTINCT (over every check's, its hash
-- table did not fit 2GB at 1 B dense events)
CREATE OR REPLACE TEMP TABLE kv_check_pass_seqs AS
SELECT run_id, check_name, count(*) AS n, max(seq) AS last_seq,
       list_sort(min(seq, /*@EVIDENCE_MAX@*/), 'ASC') AS seqs
FROM (SELECT run_id, check_name, seq FROM kv_check_rows
      WHERE part = 2 AND check_name = {check.L1}
      UNION ALL
      SELECT DISTINCT run_id, check_name, seq FROM kv_check_rows
      WHERE part = 2 AND check_name <> {check.L1})
GROUP BY run_id, check_name;

-- kv_check_claims: the claim instances of each (run, check)'s evidence, per side (failing:
-- those its failing findings name; else those the check judged): how many, and the
-- /*@EVIDENCE_MAX@*/ with the smallest claim_seq, by claim_seq
-- NOTE: an equality join, not list_contains per claim: that was quadratic in the claims
CREATE OR REPLACE TEMP TABLE kv_check_claims AS
SELECT e.run_id, e.check_name, e.failing_side, count(*) AS n,
       min_by({'claim_id': f.claim_id, 'claim_seq': f.claim_seq}, f.claim_seq,
              /*@EVIDENCE_MAX@*/) AS claims
FROM (SELECT DISTINCT run_id, check_name, true AS failing_side, claim_seq
      FROM kv_check_finding_fails WHERE claim_seq IS NOT NULL
      UNION
      SELECT DISTINCT run_id, check_name, false, claim_seq
      FROM kv_check_rows WHERE part = 3) e
JOIN kv_claim_facts f ON f.run_id = e.run_id AND f.claim_seq = e.claim_seq
GROUP BY e.run_id, e.check_name, e.failing_side;

-- kv_check_evidence: each (run, check)'s situation with its evidence, one row each
CREATE OR REPLACE TEMP TABLE kv_check_evidence AS
WITH failed AS (
    -- each (run, check) that failing findings fail, with their kinds and how many of each
    -- ('kind xN, ...', by kind); string_agg: bounded by the finding kinds
    SELECT run_id, check_name, string_agg(kind || ' x' || n, ', ' ORDER BY kind) AS kinds
    FROM (SELECT run_id, check_name, kind, count(*) AS n
          FROM kv_check_finding_fails
          GROUP BY run_id, check_name, kind)
    GROUP BY run_id, check_name
), own_failed AS (
    -- each (run, check) whose own failing condition holds (with or without a seq)
    SELECT DISTINCT run_id, check_name FROM kv_check_rows WHERE part = 1
), raw AS (
    SELECT run_id, check_name, exercised, pass_detail FROM kv_check_rows WHERE part = 0
)
SELECT raw.*,
       fe.seqs AS fail_seqs, coalesce(fe.n, 0) AS n_fail_seqs, fe.first_seq AS first_fail_seq,
       pe.seqs AS pass_seqs, coalesce(pe.n, 0) AS n_pass_seqs, pe.last_seq AS last_pass_seq,
       ff.kinds AS fail_kinds,
       ofl.run_id IS NOT NULL AS own_failing,
       ff.run_id IS NOT NULL OR ofl.run_id IS NOT NULL AS failing,
       fc.claims AS fail_claims, coalesce(fc.n, 0) AS n_fail_claims,
       pc.claims AS pass_claims, coalesce(pc.n, 0) AS n_pass_claims
FROM raw
LEFT JOIN failed ff ON ff.run_id = raw.run_id AND ff.check_name = raw.check_name
LEFT JOIN own_failed ofl ON ofl.run_id = raw.run_id AND ofl.check_name = raw.check_name
LEFT JOIN kv_check_fail_seqs fe ON fe.run_id = raw.run_id AND fe.check_name = raw.check_name
LEFT JOIN kv_check_pass_seqs pe ON pe.run_id = raw.run_id AND pe.check_name = raw.check_name
LEFT JOIN kv_check_claims fc ON fc.run_id = raw.run_id AND fc.check_name = raw.check_name
                            AND fc.failing_side
LEFT JOIN kv_check_claims pc ON pc.run_id = raw.run_id AND pc.check_name = raw.check_name
                            AND NOT pc.failing_side;

DROP TABLE kv_check_rows;
DROP TABLE kv_check_finding_fails;
DROP TABLE kv_check_fail_seqs;
DROP TABLE kv_check_pass_seqs;
DROP TABLE kv_check_claims;

CREATE OR REPLACE TABLE conformance AS
WITH unrebuilt AS (
    -- deferrals and refusals whose feasibility the trace cannot rebuild (no prompt size, no
    -- allocation: the need is unknown); the checks that judge them are unknown, never a
    -- verdict taken from the runtime's figures -- self-contained block
    SELECT run_id, count(*) AS n, list_sort(min(seq, /*@EVIDENCE_MAX@*/), 'ASC') AS seqs
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
), judged AS (
    SELECT j.*, k.ord, k.title, k.needs, k.needs_engine, k.judges_enforcement, r.evidence,
           r.has_hole,
           r.unknown_from_seq, r.hook_failed_seq, r.hook_failed_hook, r.hook_failed_error,
           le.seq AS last_enforcement_seq
    FROM kv_check_evidence j
    JOIN kv_checks k ON k."check" = j.check_name
    JOIN kv_runs r ON r.run_id = j.run_id
    LEFT JOIN last_enforcement le ON le.run_id = j.run_id
), decided AS (
    SELECT j.*, ub.seqs AS unrebuilt_seqs, ub.n AS n_unrebuilt_seqs,
           format('hook {} failed at seq {} ({}): enforcement from there on is unknown',
                  coalesce(j.hook_failed_hook, '?'), j.hook_failed_seq,
                  coalesce(j.hook_failed_error, 'unknown error')) AS hook_note,
           CASE
               WHEN j.evidence = {evidence.observed} AND j.needs_engine THEN {evidence.observed}
               WHEN j.failing AND (j.hook_failed_seq IS NULL
                                   OR j.first_fail_seq < j.hook_failed_seq
                                   -- a failing condition without a seq is not after the hook
                                   OR j.n_fail_seqs = 0) THEN {verdict.fail}
               WHEN j.failing THEN 'fail_after_hook'
               WHEN j.has_hole THEN {severity.hole}
               WHEN j.judges_enforcement AND j.exercised AND j.hook_failed_seq IS NOT NULL
                    AND (coalesce(j.last_pass_seq, j.hook_failed_seq) >= j.hook_failed_seq
                         OR j.last_enforcement_seq > j.hook_failed_seq)
                   THEN 'after_hook'
               WHEN j.check_name IN ({check.L3}, {check.INV_refusal_names_protected_claim}, {check.L_feasibility})
                    AND ub.seqs IS NOT NULL THEN 'unrebuilt'
               WHEN NOT j.exercised THEN {verdict.not_exercised}
               ELSE {verdict.pass}
           END AS why
    FROM judged j
    LEFT JOIN unrebuilt ub ON ub.run_id = j.run_id
)
SELECT
    d.run_id, d.check_name AS "check", d.title,
    CASE d.why WHEN {evidence.observed} THEN {verdict.not_exercised} WHEN {verdict.fail} THEN {verdict.fail}
               WHEN 'fail_after_hook' THEN {verdict.unknown} WHEN {severity.hole} THEN {verdict.unknown}
               WHEN 'after_hook' THEN {verdict.unknown} WHEN 'unrebuilt' THEN {verdict.unknown}
               WHEN {verdict.not_exercised} THEN {verdict.not_exercised}
               ELSE {verdict.pass} END AS verdict,
    -- the smallest /*@EVIDENCE_MAX@*/ evidence seqs, ascending (reconstruct/checks.py EVIDENCE_MAX)
    CASE WHEN d.why IN ({verdict.fail}, 'fail_after_hook') THEN coalesce(d.fail_seqs, []::BIGINT[])
         WHEN d.why = 'after_hook' THEN [d.hook_failed_seq]
         WHEN d.why = 'unrebuilt' THEN d.unrebuilt_seqs
         WHEN d.why IN ({evidence.observed}, {verdict.not_exercised}) THEN []::BIGINT[]
         ELSE coalesce(d.pass_seqs, []::BIGINT[])
    END AS evidence_seqs,
    -- how many evidence seqs there are in all (evidence_seqs holds the smallest of them)
    CASE WHEN d.why IN ({verdict.fail}, 'fail_after_hook') THEN d.n_fail_seqs
         WHEN d.why = 'after_hook' THEN 1
         WHEN d.why = 'unrebuilt' THEN d.n_unrebuilt_seqs
         WHEN d.why IN ({evidence.observed}, {verdict.not_exercised}) THEN 0
         ELSE d.n_pass_seqs
    END AS evidence_seq_count,
    CASE d.why
        WHEN {evidence.observed} THEN 'not exercised: an observed run (stock-vLLM listener) holds no '
                             'in-engine requests, admissions or arbiter decisions; this check '
                             'needs ' || d.needs
        WHEN {verdict.fail} THEN coalesce('failing findings: ' || d.fail_kinds
                                  || CASE WHEN d.own_failing
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
    -- the claim instances the evidence is about: (claim_id, claim_seq), the smallest
    -- /*@EVIDENCE_MAX@*/ by claim_seq (for a fail those its failing findings name, for a pass
    -- or an unknown those the check judged), and how many in all
    CASE WHEN d.why IN ({verdict.fail}, 'fail_after_hook') THEN coalesce(d.fail_claims, [])
         WHEN d.why IN ({verdict.pass}, {severity.hole}, 'after_hook') THEN coalesce(d.pass_claims, [])
         ELSE [] END AS evidence_claims,
    CASE WHEN d.why IN ({verdict.fail}, 'fail_after_hook') THEN d.n_fail_claims
         WHEN d.why IN ({verdict.pass}, {severity.hole}, 'after_hook') THEN d.n_pass_claims
         ELSE 0 END AS evidence_claim_count
FROM decided d
ORDER BY d.run_id, d.ord;

-- NOTE: the `lowering` table (one row per run and mode) is built by 07_findings.sql, before
-- the findings that compare it with the manifest's claim.
