-- Stage 6: findings. Every hole in the evidence, every disagreement between the runtime's own
-- reports and the reconstruction, every invariant violation and every trace anomaly, each
-- with the seq numbers involved. severity: hole | disagreement | violation | security | anomaly
-- | info (the expected consequence of a policy that enforces no claim).
-- Every finding that names a claim names its instance: (claim_id, claim_seq).
-- NOTE: events come from kv_stage_events (05_feasibility: the non-block events, scanned once).

-- Lowering (seed 004; docs/conformance.md "Lowering verdicts") -- self-contained block.
-- One row per run and protection mode: the class the run's evidence supports, fail-closed,
-- beside what the manifest declares (the runtime's claim, never the verdict).
CREATE OR REPLACE TEMP TABLE kv_lowering_words AS
SELECT * FROM (VALUES
    /*@KV_LOWERING_CLASSES@*/
) t(word, class, rank);

CREATE OR REPLACE TABLE lowering AS
WITH mode_ev AS (
    SELECT f.run_id, f.protection_mode AS mode,
           min(f.rejected_seq) FILTER (WHERE f.accepted_seq IS NULL) AS rejected_seq,
           arg_min(f.reject_reason, f.rejected_seq) FILTER (WHERE f.accepted_seq IS NULL)
               AS reject_reason,
           min(f.accepted_seq) AS accepted_seq
    FROM kv_claim_facts f
    WHERE f.protection_mode IS NOT NULL
    GROUP BY ALL
), broken AS (
    -- the mode's promise broken in the run: a loss of a claim of the mode labelled harm
    SELECT run_id, protection_mode AS mode, min(seq) AS broken_seq,
           count(DISTINCT claim_seq) AS n_claims
    FROM loss_claims WHERE label = {label.harm} AND protection_mode IS NOT NULL
    GROUP BY ALL
), pressed AS (
    -- a claim of the mode met pressure: it protected blocks at a decision the trace shows
    -- infeasible, it lost content after its acceptance (any label), or it was demoted/expired
    SELECT run_id, mode, min(seq) AS pressed_seq
    FROM (SELECT x.run_id, c.protection_mode AS mode, x.seq
          FROM (SELECT run_id, seq, unnest(protected_claim_seqs) AS claim_seq
                FROM feasibility WHERE NOT feasible) x
          JOIN kv_claim_facts c ON c.run_id = x.run_id AND c.claim_seq = x.claim_seq
          UNION ALL
          SELECT run_id, protection_mode, min(seq) FROM loss_claims
          WHERE accepted_seq < seq GROUP BY ALL
          UNION ALL
          SELECT run_id, protection_mode, release_seq FROM kv_claim_facts
          WHERE release_event IN ({event.claim_demoted}, {event.claim_expired}))
    WHERE mode IS NOT NULL
    GROUP BY ALL
), derived AS (
    SELECT r.run_id, m.mode,
           b.broken_seq IS NOT NULL
           AND b.broken_seq < least(coalesce(r.hook_failed_seq, b.broken_seq + 1),
                                    coalesce(r.unknown_from_seq, b.broken_seq + 1)) AS broken,
           b.broken_seq, b.n_claims, p.pressed_seq, e.accepted_seq, e.rejected_seq,
           e.reject_reason, m.enforced_verdict, m.enforcement, r.enforcing, r.policy,
           r.evidence AS run_evidence, r.has_hole, r.hook_failed_seq, r.schema_version
    FROM kv_runs r
    CROSS JOIN kv_modes m
    LEFT JOIN mode_ev e ON e.run_id = r.run_id AND e.mode = m.mode
    LEFT JOIN broken b ON b.run_id = r.run_id AND b.mode = m.mode
    LEFT JOIN pressed p ON p.run_id = r.run_id AND p.mode = m.mode
), classed AS (
    -- NOTE: first match, fail-closed: a broken promise is never read as kept, and a kept one
    -- needs pressure the run shows; native conformance is never derived from a kvclaims
    -- trace (its claims go through hooks added to vLLM: an adapter)
    SELECT d.*,
           CASE
               WHEN d.mode = {mode.offloadable} AND d.rejected_seq IS NOT NULL THEN 'rejected mapping'
               WHEN d.mode = {mode.offloadable} AND d.accepted_seq IS NOT NULL
                   THEN 'adapter-observational evidence'
               WHEN d.mode = {mode.offloadable} AND coalesce(d.schema_version, 1) >= 2
                   THEN 'rejected mapping'
               WHEN d.mode = {mode.offloadable} THEN 'unknown evidence'
               WHEN d.enforced_verdict = {claim_outcome.rejected} THEN 'rejected mapping'
               WHEN NOT d.enforcing OR d.run_evidence = {evidence.observed}
                   THEN 'adapter-observational evidence'
               WHEN d.broken THEN 'rejected mapping'
               WHEN d.has_hole OR d.hook_failed_seq IS NOT NULL THEN 'unknown evidence'
               WHEN d.enforced_verdict = 'recorded only' OR d.mode = {mode.best_effort}
                   THEN 'adapter-observational evidence'
               WHEN d.enforced_verdict = 'approximated' THEN 'approximation substrate'
               WHEN d.pressed_seq IS NOT NULL THEN 'adapter-policy evidence'
               ELSE 'unknown evidence'
           END AS verdict
    FROM derived d
)
SELECT c.run_id, c.mode, c.verdict,
       CASE
           WHEN c.mode = {mode.offloadable} AND c.rejected_seq IS NOT NULL
               THEN format('an offloadable claim was rejected at seq {}: {}', c.rejected_seq,
                           coalesce(c.reject_reason, '?'))
           WHEN c.mode = {mode.offloadable} AND c.accepted_seq IS NOT NULL
               THEN format('an offloadable claim was accepted at seq {}, but offload is not '
                           'implemented: its blocks are ordinary cache entries', c.accepted_seq)
           WHEN c.mode = {mode.offloadable} AND coalesce(c.schema_version, 1) >= 2
               THEN 'the schema-2 recorder rejects offloadable at submission (offload is not '
                    'implemented); no such claim in this run'
           WHEN c.mode = {mode.offloadable} THEN 'no offloadable claim in this run, and the trace '
                                            'predates the recorder''s rejection of the mode'
           WHEN c.enforced_verdict = {claim_outcome.rejected} THEN c.enforcement
           WHEN NOT c.enforcing OR c.run_evidence = {evidence.observed}
               THEN format('policy {} enforces no claim: claims are recorded and judged, never '
                           'enforced{}', coalesce(c.policy, '(unknown)'),
                           CASE WHEN c.broken_seq IS NOT NULL
                                THEN format('; {} claim instance(s) harmed from seq {}',
                                            c.n_claims, c.broken_seq) ELSE '' END)
           WHEN c.broken
               THEN format('policy {}: the promise was broken in this run: {} claim '
                           'instance(s) of the mode harmed, first at seq {}', c.policy,
                           c.n_claims, c.broken_seq)
           WHEN c.has_hole OR c.hook_failed_seq IS NOT NULL
               THEN format('policy {}: the run has a hole or a hook failure, so whether the '
                           'promise was kept is not known', c.policy)
           WHEN c.verdict = 'adapter-policy evidence'
               THEN format('policy {}: {}; a claim of the mode met pressure at seq {} and '
                           'nothing of it was harmed', c.policy, c.enforcement, c.pressed_seq)
           WHEN c.verdict = 'unknown evidence'
               THEN format('policy {}: {}; but no claim of the mode met pressure in this run',
                           c.policy, c.enforcement)
           ELSE format('policy {}: {}', c.policy, c.enforcement)
       END AS evidence,
       'evidence' AS source,
       -- what the manifest declares (the runtime's claim): its class, NULL when it declares
       -- none or a value outside the vocabulary (declared_in_vocabulary false)
       w.class AS declared,
       ml.evidence AS declared_evidence,
       CASE WHEN ml.verdict IS NULL THEN NULL ELSE w.class IS NOT NULL END
           AS declared_in_vocabulary,
       c.broken_seq
FROM classed c
LEFT JOIN kv_manifest_lowering ml ON ml.run_id = c.run_id AND ml.mode = c.mode
LEFT JOIN kv_lowering_words w ON w.word = lower(trim(ml.verdict))
ORDER BY c.run_id, list_position((SELECT list(mode) FROM kv_modes), c.mode);
-- Demotion justification (docs/design.md §5 "Lifecycle legitimacy"): each legitimate,
-- verified demotion with the admission decision of the request it names (by_request_id): the
-- first decision of that request after the demotion, in the same scheduler step when the trace
-- has steps. Justified only if that decision is infeasible once the blocks the demotion freed
-- are counted back as protected (rebuilt figures of `feasibility`).
-- NOTE: self-contained block; uses feasibility's rebuilt figures (the same inequality as its
-- `feasible`: protected + active live + required <= usable, with the freed blocks added to the
-- protected side).
CREATE OR REPLACE TEMP TABLE kv_demotion_checks AS
WITH dem AS (
    SELECT x.run_id, x.seq, x.step, x.claim_id, x.claim_seq, x.by_request_id,
           coalesce(fr.freed_blocks, 0) AS freed_blocks
    FROM kv_lifecycle_ends x
    LEFT JOIN kv_release_freed fr
      ON fr.run_id = x.run_id AND fr.seq = x.seq AND fr.claim_seq = x.claim_seq
    WHERE x.event = {event.claim_demoted} AND x.legit AND x.verified
), cand AS (
    SELECT d.run_id, d.seq, f.seq AS decision_seq, f.protected_blocks, f.live_blocks,
           f.required_blocks, f.usable_blocks,
           row_number() OVER (PARTITION BY d.run_id, d.seq ORDER BY f.seq) AS rn
    FROM dem d
    JOIN feasibility f
      ON f.run_id = d.run_id AND f.request_id = d.by_request_id AND f.seq > d.seq
         AND f.event IN ({event.request_admitted}, {event.request_deferred}, {event.request_refused})
    WHERE d.step IS NULL OR f.step = d.step
)
SELECT d.*, c.decision_seq, c.protected_blocks, c.live_blocks, c.required_blocks,
       c.usable_blocks,
       -- seed 000's inequality with the freed blocks counted back as protected
       coalesce(d.by_request_id IS NOT NULL AND c.decision_seq IS NOT NULL
                AND c.protected_blocks + d.freed_blocks + coalesce(c.live_blocks, 0)
                    + c.required_blocks > c.usable_blocks,
                false) AS justified
FROM dem d
LEFT JOIN cand c ON c.run_id = d.run_id AND c.seq = d.seq AND c.rn = 1;

-- Every finding, in no order (kv_findings_rows); then findings, the same rows sorted.
-- NOTE: two statements, as for feasibility (05_feasibility.sql): the sort on its own spills,
-- beside the union's joins it ran out of memory_limit (100 M events under 400MB).
CREATE OR REPLACE TEMP TABLE kv_findings_rows AS
WITH f AS (
    -- holes ---------------------------------------------------------------------------------
    -- NOTE: the hole starts at the first seq of the scheduler step the gap falls in (stage 01)
    SELECT g.run_id, {finding.recorder_gap} AS kind, {severity.hole} AS severity, g.seq,
           [g.seq, g.first_seq, g.last_seq] AS seqs, NULL AS claim_id, NULL::BIGINT AS claim_seq,
           NULL AS request_id, NULL::UBIGINT AS block_hash,
           format('recorder dropped {} events (seq {}..{}): every loss from seq {} on is unknown',
                  coalesce(g.events_dropped::VARCHAR, '?'), coalesce(g.first_seq::VARCHAR, '?'),
                  coalesce(g.last_seq::VARCHAR, '?'),
                  least(g.seq, g.first_seq, r.unknown_from_seq)) AS detail
    FROM kv_stage_events g JOIN kv_runs r ON r.run_id = g.run_id
    WHERE g.event = {event.recorder_gap}
    UNION ALL
    SELECT run_id, {finding.seq_hole}, {severity.hole}, hole_seq, [hole_seq], NULL, NULL, NULL, NULL,
           format('seq {} is missing and no recorder_gap covers it', hole_seq)
    FROM kv_runs WHERE hole_seq IS NOT NULL AND (gap_seq IS NULL OR hole_seq < gap_seq)
    UNION ALL
    SELECT run_id, {finding.missing_head}, {severity.hole}, first_seq, [first_seq], NULL, NULL, NULL, NULL,
           format('the run starts at seq {} with {} instead of run_started at seq 0: its head '
                  'is missing, every loss is unknown', first_seq, first_event)
    FROM kv_runs WHERE head_missing
    UNION ALL
    SELECT run_id, {finding.truncated}, {severity.hole}, last_seq, [last_seq], NULL, NULL, NULL, NULL,
           format('the run''s last segment is truncated after seq {}: outcomes that could '
                  'still change are unknown', last_seq)
    FROM kv_runs WHERE truncated
    UNION ALL
    -- fail-open: a hook or the arbiter raised inside vLLM; the engine kept serving, so what
    -- enforcement did from here on is not known (checks judged after it are `unknown`)
    SELECT run_id, {finding.hook_failed}, {severity.hole}, seq, [seq], NULL, NULL, NULL, NULL,
           format('hook {} failed inside vLLM at seq {} ({}); the engine kept serving: '
                  'enforcement from seq {} on is unknown, not blamed on the policy',
                  coalesce(hook, '?'), seq, coalesce(error_type, 'unknown error'), seq)
    FROM kv_stage_events WHERE event = {event.hook_failed}

    -- runtime reports vs reconstruction ------------------------------------------------------
    UNION ALL
    SELECT c.run_id, {finding.harm_not_reported}, {severity.disagreement}, c.first_harm_seq,
           [c.first_harm_seq], c.claim_id, c.claim_seq, NULL, NULL,
           format('claim {} was harmed at seq {} (reconstructed) but the runtime reported no '
                  {event.claim_harmed}, c.claim_id, c.first_harm_seq)
    FROM claims c
    -- NOTE: the runtime reports harm of residency promises only; a soft_priority harm is
    -- decided from the timeline (the other evictable blocks), so no report is expected
    WHERE c.outcome = {claim_outcome.harmed} AND c.reported_harm_seq IS NULL
      AND c.protection_mode IN (SELECT mode FROM kv_modes WHERE residency)
    UNION ALL
    SELECT f.run_id, {finding.harm_reported_not_reconstructed}, {severity.disagreement}, f.reported_harm_seq,
           [f.reported_harm_seq], f.claim_id, f.claim_seq, NULL, NULL,
           format('the runtime reported claim_harmed for {} at seq {}, the trace shows no harm',
                  f.claim_id, f.reported_harm_seq)
    FROM claims f JOIN kv_runs r USING (run_id)
    WHERE f.reported_harm_seq IS NOT NULL AND f.first_harm_seq IS NULL
      AND f.outcome <> {claim_outcome.unknown}
      AND f.reported_harm_seq < coalesce(r.unknown_from_seq, f.reported_harm_seq + 1)
    UNION ALL
    SELECT run_id, {finding.harm_reported_before_loss}, {severity.disagreement}, reported_harm_seq,
           [reported_harm_seq, first_harm_seq], claim_id, claim_seq, NULL, NULL,
           format('the runtime reported claim_harmed for {} at seq {}, before the loss that '
                  'harmed it (seq {})', claim_id, reported_harm_seq, first_harm_seq)
    FROM claims WHERE reported_harm_seq < first_harm_seq
    UNION ALL
    SELECT e.run_id, {finding.materialized_reported_predicate_false}, {severity.disagreement}, e.seq,
           [e.seq], e.claim_id, e.claim_seq, NULL, NULL,
           format('the runtime reported claim_materialized for {} at seq {}, but positions '
                  '0..{} are not all bound and resident there', e.claim_id, e.seq,
                  coalesce(f.k - 1, -1))
    FROM kv_claim_refs e
    JOIN kv_runs r ON r.run_id = e.run_id
    JOIN kv_claim_facts f ON f.run_id = e.run_id AND f.claim_seq = e.claim_seq
    WHERE e.event = {event.claim_materialized}
      AND e.seq < coalesce(r.unknown_from_seq, e.seq + 1)
      AND NOT EXISTS (SELECT 1 FROM kv_pred q
                      WHERE q.run_id = e.run_id AND q.claim_seq = e.claim_seq
                        AND q.from_seq <= e.seq AND (q.to_seq IS NULL OR q.to_seq > e.seq))
    UNION ALL
    -- a claim_materialized report of a claim instance the trace does not show accepted before
    -- it: the predicate cannot hold for it (an unknown id included)
    SELECT e.run_id, {finding.materialized_reported_not_accepted}, {severity.disagreement}, e.seq, [e.seq],
           e.claim_id, e.claim_seq, NULL, NULL,
           format('the runtime reported claim_materialized for {} at seq {}, but the trace shows '
                  'no accepted instance of it there', e.claim_id, e.seq)
    FROM kv_claim_refs e
    JOIN kv_runs r ON r.run_id = e.run_id
    LEFT JOIN kv_claim_facts f ON f.run_id = e.run_id AND f.claim_seq = e.claim_seq
    WHERE e.event = {event.claim_materialized}
      AND e.seq < coalesce(r.unknown_from_seq, e.seq + 1)
      AND (f.claim_seq IS NULL OR f.accepted_seq IS NULL OR f.accepted_seq > e.seq)
    UNION ALL
    SELECT c.run_id, {finding.materialization_not_reported}, {severity.disagreement}, c.materialized_seq,
           [c.materialized_seq], c.claim_id, c.claim_seq, NULL, NULL,
           format('claim {} materialized at seq {} (reconstructed) but the runtime, which '
                  'reports materialization in this run, did not report it', c.claim_id,
                  c.materialized_seq)
    FROM claims c JOIN kv_runs r USING (run_id)
    WHERE c.materialized_seq IS NOT NULL AND c.reported_materialized_seq IS NULL
      AND c.materialized_seq < coalesce(r.unknown_from_seq, c.materialized_seq + 1)
      AND EXISTS (SELECT 1 FROM kv_claim_refs m
                  WHERE m.run_id = c.run_id AND m.event = {event.claim_materialized})
    UNION ALL
    -- the runtime's own figures disagree with its own shortfall
    SELECT e.run_id, {finding.shortfall_mismatch}, {severity.disagreement}, e.seq, [e.seq], NULL, NULL,
           e.request_id, NULL,
           format('request {} at seq {}: reported shortfall {} but protected {} + required {} '
                  '- usable {} = {}', e.request_id, e.seq, e.shortfall_blocks,
                  e.protected_blocks, e.blocks_required, coalesce(e.usable_blocks, r.usable_blocks),
                  greatest(0, e.protected_blocks + e.blocks_required
                              - coalesce(e.usable_blocks, r.usable_blocks)))
    FROM kv_stage_events e JOIN kv_runs r ON r.run_id = e.run_id
    WHERE e.event IN ({event.request_admitted}, {event.request_deferred}, {event.request_refused})
      AND e.shortfall_blocks IS NOT NULL AND e.protected_blocks IS NOT NULL
      AND e.blocks_required IS NOT NULL
      AND e.shortfall_blocks <> greatest(0, e.protected_blocks + e.blocks_required
                                            - coalesce(e.usable_blocks, r.usable_blocks))
    UNION ALL
    -- feasibility rebuilt from the block timeline vs the runtime's own figures (issue 24
    -- item 3) -- self-contained block: every figure that differs is a finding, both side by
    -- side. NOTE: under a policy that enforces no claim (native, write_no_admit) the runtime
    -- protects nothing, so a different protected figure, required figure (it takes no hit on
    -- protected content off), shortfall, blocker list or verdict is the expected consequence
    -- of the policy: severity info, not disagreement.
    SELECT f.run_id, {finding.feasibility_disagreement},
           CASE WHEN r.enforcing THEN {severity.disagreement} ELSE {severity.info} END, f.seq, [f.seq], NULL,
           NULL, f.request_id, NULL,
           format('{} of request {} at seq {}: the trace shows protected {} + live {} + '
                  'required {} (feasible: {}), the runtime reported protected {} + required {} '
                  '(feasible: {}); usable {}{}', f.event, f.request_id, f.seq,
                  f.protected_blocks, f.live_blocks, f.required_blocks, f.feasible,
                  coalesce(f.runtime_protected_blocks::VARCHAR, '?'),
                  coalesce(f.runtime_required_blocks::VARCHAR, '?'),
                  coalesce(f.runtime_feasible::VARCHAR, '?'), f.usable_blocks,
                  CASE WHEN r.enforcing THEN ''
                       ELSE format(' (policy {} enforces no claim: expected)', r.policy) END)
    FROM feasibility f JOIN kv_runs r ON r.run_id = f.run_id
    WHERE f.agrees = false AND f.seq < coalesce(r.unknown_from_seq, f.seq + 1)
    UNION ALL
    SELECT x.run_id, {finding.feasibility_figure_mismatch},
           CASE WHEN x.enforcing THEN {severity.disagreement} ELSE {severity.info} END, x.seq, [x.seq], NULL, NULL, x.request_id, NULL,
           format('{} of request {} at seq {}: {} rebuilt from the trace {}, the runtime '
                  'reported {}{}', x.event, x.request_id, x.seq, x.figure, x.rebuilt, x.reported,
                  CASE WHEN x.enforcing THEN ''
                       ELSE format(' (policy {} enforces no claim: expected)', x.policy) END)
    FROM (SELECT run_id, seq, event, request_id, enforcing, policy, t.figure, t.rebuilt,
                 t.reported
          -- NOTE: each decision's figures as a list of structs, unnested: a LATERAL VALUES
          -- over feasibility's columns is decorrelated by grouping feasibility on every
          -- column it reads (lists included), which cost more than the rest of the findings
          FROM (SELECT f.run_id, f.seq, f.event, f.request_id, f.enforcing, f.policy,
                       unnest([
                           {'figure': 'protected blocks',
                            'rebuilt': f.protected_blocks::VARCHAR,
                            'reported': f.runtime_protected_blocks::VARCHAR},
                           {'figure': 'required', 'rebuilt': f.required_blocks::VARCHAR,
                            'reported': f.runtime_required_blocks::VARCHAR},
                           {'figure': 'shortfall', 'rebuilt': f.shortfall_blocks::VARCHAR,
                            'reported': f.runtime_shortfall_blocks::VARCHAR},
                           {'figure': 'blocking claims',
                            'rebuilt': CASE WHEN f.event IN ({event.request_deferred},
                                                             {event.request_refused})
                                            THEN array_to_string(f.protected_claim_ids, ',')
                                       END,
                            'reported': CASE WHEN f.event IN ({event.request_deferred},
                                                              {event.request_refused})
                                             THEN array_to_string(list_sort(list_distinct(
                                                      coalesce(f.blocking_claim_ids,
                                                               []::VARCHAR[]))), ',')
                                        END}]) AS t
                FROM feasibility f
                JOIN kv_runs r ON r.run_id = f.run_id
                WHERE f.seq < coalesce(r.unknown_from_seq, f.seq + 1))
          WHERE t.rebuilt IS NOT NULL AND t.reported IS NOT NULL
            AND t.rebuilt <> t.reported) x
    UNION ALL
    -- what vLLM told the client it served from cache vs the prefix hit the trace shows
    SELECT q.run_id, {finding.cached_tokens_mismatch}, {severity.disagreement}, q.finished_seq,
           [q.finished_seq], q.claim_id, q.claim_seq, q.request_id, NULL,
           format('request {} finished at seq {}: vLLM reported {} cached tokens, the trace '
                  'shows a prefix hit of {} tokens', q.request_id, q.finished_seq,
                  q.num_cached_tokens, q.reconstructed_cached_tokens)
    FROM requests q JOIN kv_runs r ON r.run_id = q.run_id
    WHERE r.evidence = {evidence.in_engine}
      AND q.num_cached_tokens IS NOT NULL AND q.reconstructed_cached_tokens IS NOT NULL
      AND q.num_cached_tokens <> q.reconstructed_cached_tokens
      AND q.finished_seq < coalesce(r.unknown_from_seq, q.finished_seq + 1)

    -- invariants -----------------------------------------------------------------------------
    UNION ALL
    SELECT e.run_id, {finding.harm_without_acceptance}, {severity.violation}, e.seq,
           [v FOR v IN [e.seq, f.accepted_seq] IF v IS NOT NULL], e.claim_id, e.claim_seq,
           NULL, e.block_hash,
           format('claim_harmed for {} at seq {} but the claim was not accepted before it',
                  e.claim_id, e.seq)
    FROM kv_claim_refs e
    LEFT JOIN kv_claim_facts f ON f.run_id = e.run_id AND f.claim_seq = e.claim_seq
    WHERE e.event = {event.claim_harmed} AND (f.accepted_seq IS NULL OR f.accepted_seq > e.seq)
    UNION ALL
    SELECT run_id, {finding.loss_before_release}, {severity.violation}, seq, [seq, release_seq], claim_id,
           claim_seq, by_request_id, block_hash,
           format('claim {} lost block {} at seq {} (harm) before its {} at seq {}',
                  claim_id, block_id, seq, release_event, release_seq)
    FROM loss_claims WHERE label = {label.harm} AND release_seq IS NOT NULL AND seq < release_seq
    UNION ALL
    SELECT run_id, {finding.label_without_prior_release}, {severity.violation}, seq, [seq, decided_by_seq],
           claim_id, claim_seq, by_request_id, block_hash,
           format('loss at seq {} labelled {} without a release strictly before it',
                  seq, label)
    FROM loss_claims
    WHERE label IN ({label.relaxation}, {label.expiry})
      AND NOT (decided_by_seq IS NOT NULL AND decided_by_seq < seq)
    UNION ALL
    SELECT l.run_id, {finding.protected_block_lost}, {severity.violation}, l.seq,
           [l.seq, l.accepted_seq], l.claim_id, l.claim_seq, l.by_request_id, l.block_hash,
           format('block {} (position {} of {} claim {}) was lost at seq {} while the claim '
                  'was in force under enforcing policy {}', l.block_id, l.position,
                  l.protection_mode, l.claim_id, l.seq, r.policy)
    FROM loss_claims l
    JOIN kv_runs r ON r.run_id = l.run_id
    JOIN kv_claim_facts f ON f.run_id = l.run_id AND f.claim_seq = l.claim_seq
    WHERE f.pinned_mode AND l.label <> {label.unknown}
      AND l.accepted_seq < l.seq AND (l.release_seq IS NULL OR l.release_seq > l.seq)
      AND l.position < l.threshold_blocks
    UNION ALL
    SELECT f.run_id, {finding.infeasible_admission}, {severity.violation}, f.seq, [f.seq], NULL, NULL,
           f.request_id, NULL,
           format('request {} admitted at seq {} with protected {} + required {} > usable {} '
                  '(rebuilt from the trace) under enforcing policy {}', f.request_id, f.seq,
                  f.protected_blocks, f.required_blocks, f.usable_blocks, r.policy)
    FROM feasibility f JOIN kv_runs r ON r.run_id = f.run_id
    WHERE f.event = {event.request_admitted} AND r.enforcing AND NOT f.feasible
    UNION ALL
    SELECT e.run_id, {finding.refusal_without_blocking_claim}, {severity.violation}, e.seq, [e.seq], NULL,
           NULL, e.request_id, NULL,
           format('request {} refused at seq {} without naming a blocking claim',
                  e.request_id, e.seq)
    FROM kv_stage_events e
    WHERE e.event = {event.request_refused} AND coalesce(len(e.blocking_claim_ids), 0) = 0
    UNION ALL
    SELECT x.run_id,
           CASE WHEN f.claim_id IS NULL OR f.submitted_seq IS NULL
                    THEN {finding.refusal_names_unknown_claim}
                WHEN f.accepted_seq IS NULL OR f.accepted_seq > x.seq
                     OR f.release_seq < x.seq THEN {finding.refusal_names_claim_not_in_force}
                WHEN m.materialized_seq IS NULL OR m.materialized_seq > x.seq
                    THEN {finding.refusal_names_unmaterialized_claim}
                ELSE {finding.refusal_names_unprotected_claim} END,
           {severity.violation}, x.seq,
           [v FOR v IN [x.seq, f.accepted_seq, f.release_seq] IF v IS NOT NULL],
           x.claim_id, x.claim_seq, x.request_id, NULL,
           format('request {} refused at seq {} naming claim {}, which is not an in-force, '
                  'materialized, protected claim there', x.request_id, x.seq, x.claim_id)
    FROM (SELECT run_id, seq, request_id, claim_id, claim_seq
          FROM kv_claim_refs WHERE event = {event.request_refused}) x
    LEFT JOIN kv_claim_facts f ON f.run_id = x.run_id AND f.claim_seq = x.claim_seq
    LEFT JOIN kv_materialized m ON m.run_id = x.run_id AND m.claim_seq = x.claim_seq
    WHERE f.claim_id IS NULL OR f.submitted_seq IS NULL
       OR f.accepted_seq IS NULL OR f.accepted_seq > x.seq OR f.release_seq < x.seq
       OR m.materialized_seq IS NULL OR m.materialized_seq > x.seq
       OR NOT f.pinned_mode

    UNION ALL
    -- a refusal or deferral is justified only when the rebuilt figures are infeasible and it
    -- names the claims whose blocks were needed (issue 24 item 3) -- self-contained block
    SELECT f.run_id,
           CASE f.event WHEN {event.request_refused} THEN {finding.unjustified_refused}
                        ELSE {finding.unjustified_deferred} END,
           {severity.violation}, f.seq, [f.seq], NULL, NULL,
           f.request_id, NULL,
           format('request {} {} at seq {} although it fit: protected {} + live {} + required '
                  '{} <= usable {} (rebuilt from the trace)', f.request_id, f.decision, f.seq,
                  f.protected_blocks, f.live_blocks, f.required_blocks, f.usable_blocks)
    FROM feasibility f JOIN kv_runs r ON r.run_id = f.run_id
    WHERE f.event IN ({event.request_deferred}, {event.request_refused}) AND f.feasible
      AND f.seq < coalesce(r.unknown_from_seq, f.seq + 1)
    UNION ALL
    SELECT x.run_id, {finding.refusal_names_claim_holding_no_blocks}, {severity.violation}, x.seq, [x.seq],
           x.claim_id, x.claim_seq, x.request_id, NULL,
           format('request {} {} at seq {} naming claim {}, which held no protected block '
                  'there (rebuilt from the trace)', x.request_id,
                  replace(x.event, 'request_', ''), x.seq, x.claim_id)
    FROM kv_claim_refs x
    JOIN feasibility f ON f.run_id = x.run_id AND f.seq = x.seq
    JOIN kv_runs r ON r.run_id = x.run_id
    -- NOTE: only an in-force claim of a pinning mode: the refusal_names_* kinds above say
    -- what else is wrong with a named claim
    JOIN kv_claim_facts c ON c.run_id = x.run_id AND c.claim_seq = x.claim_seq
    WHERE x.event IN ({event.request_deferred}, {event.request_refused})
      AND c.pinned_mode AND c.accepted_seq < x.seq AND coalesce(c.release_seq, x.seq + 1) > x.seq
      AND NOT list_contains(coalesce(f.protected_claim_seqs, []::BIGINT[]), x.claim_seq)
      AND f.protected_claim_seqs IS NOT NULL
      AND x.seq < coalesce(r.unknown_from_seq, x.seq + 1)

    UNION ALL
    -- the manifest's lowering claim vs the class the evidence supports -- self-contained block
    SELECT l.run_id, {finding.lowering_value_unknown}, {severity.disagreement}, NULL::BIGINT, []::BIGINT[],
           NULL, NULL, NULL, NULL,
           format('the manifest declares a lowering for mode {} that is not a lowering class '
                  '(one of: {}); the evidence gives {}', l.mode,
                  (SELECT string_agg(class, ', ' ORDER BY rank) FROM
                       (SELECT DISTINCT class, rank FROM kv_lowering_words)), l.verdict)
    FROM lowering l WHERE l.declared_in_vocabulary = false
    UNION ALL
    SELECT l.run_id, {finding.lowering_claim_unsupported},
           CASE WHEN l.verdict = 'unknown evidence' THEN {severity.info} ELSE {severity.disagreement} END,
           l.broken_seq, [v FOR v IN [l.broken_seq] IF v IS NOT NULL], NULL, NULL, NULL, NULL,
           format('the manifest declares {} for mode {}; the run''s evidence gives {}: {}',
                  l.declared, l.mode, l.verdict, l.evidence)
    FROM lowering l
    JOIN kv_lowering_words wd ON wd.word = l.declared
    JOIN kv_lowering_words wv ON wv.word = l.verdict
    WHERE wd.rank < wv.rank
    UNION ALL
    -- chunking does not bound live KV: the runtime judged a chunked request's admission on
    -- fewer blocks than its full prompt less hits -- self-contained block
    SELECT f.run_id, {finding.chunk_counted_as_need}, {severity.disagreement}, f.seq, [f.seq], NULL, NULL,
           f.request_id, NULL,
           format('request {} admitted at seq {} and allocated over {} scheduler steps: the '
                  'runtime counted {} block(s), its full prompt less hits is {}', f.request_id,
                  f.seq, ch.n_steps, f.runtime_required_blocks, f.required_blocks)
    FROM feasibility f
    JOIN (SELECT run_id, request_id, count(DISTINCT step) AS n_steps
          FROM kv_request_blocks WHERE step IS NOT NULL AND n_allocated > 0
          GROUP BY run_id, request_id HAVING count(DISTINCT step) > 1) ch
      ON ch.run_id = f.run_id AND ch.request_id = f.request_id
    JOIN kv_runs r ON r.run_id = f.run_id
    WHERE f.event = {event.request_admitted} AND f.runtime_required_blocks < f.required_blocks
      AND f.seq < coalesce(r.unknown_from_seq, f.seq + 1)

    -- security ------------------------------------------------------------------------------
    UNION ALL
    -- a release asked for by someone who does not own the claim, refused by the arbiter:
    -- shown because it is an attempt to strip another tenant's protection (issue 8 item 8)
    SELECT x.run_id, {finding.claim_release_refused}, {severity.security}, x.seq, [x.seq], x.claim_id,
           x.claim_seq, x.request_id, NULL,
           format('a release of claim {} (tenant {}) was refused at seq {}: asked by {} '
                  '(request {}){}', x.claim_id, coalesce(f.tenant, '?'), x.seq,
                  CASE WHEN x.tenant IS NULL THEN 'no tenant' ELSE 'tenant ' || x.tenant END,
                  coalesce(x.request_id, '?'),
                  CASE WHEN x.reason IS NULL THEN '' ELSE ': ' || x.reason END)
    FROM kv_claim_refs x
    LEFT JOIN kv_claim_facts f ON f.run_id = x.run_id AND f.claim_seq = x.claim_seq
    WHERE x.event = {event.claim_release_refused}

    -- anomalies ------------------------------------------------------------------------------
    UNION ALL
    SELECT l.run_id, {finding.evicted_unknown_content}, {severity.anomaly}, l.seq, [l.seq], NULL, NULL,
           l.by_request_id, NULL,
           format('block {} evicted at seq {} without a hash and without a prior block_cached: '
                  'its label is unknown', l.block_id, l.seq)
    FROM kv_losses l JOIN kv_runs r USING (run_id)
    WHERE l.block_hash IS NULL AND l.seq < coalesce(r.unknown_from_seq, l.seq + 1)
    UNION ALL
    SELECT l.run_id, {finding.evicted_block_not_resident}, {severity.anomaly}, l.seq, [l.seq], NULL, NULL,
           l.by_request_id, l.block_hash,
           format('block {} evicted at seq {} but it held no cached content', l.block_id, l.seq)
    FROM kv_losses l JOIN kv_runs r USING (run_id)
    WHERE NOT l.was_resident AND l.block_hash IS NOT NULL
      AND l.seq < coalesce(r.unknown_from_seq, l.seq + 1)
    UNION ALL
    SELECT l.run_id, {finding.evicted_hash_mismatch}, {severity.anomaly}, l.seq, [l.seq], NULL, NULL,
           l.by_request_id, l.reported_hash,
           format('block {} evicted at seq {} with hash {} but it held {}', l.block_id, l.seq,
                  l.reported_hash, l.held_hash)
    FROM kv_losses l
    WHERE l.reported_hash IS NOT NULL AND l.held_hash IS NOT NULL
      AND l.reported_hash <> l.held_hash
    UNION ALL
    SELECT c.run_id, {finding.block_overwritten}, {severity.anomaly}, c.end_seq, [c.start_seq, c.end_seq],
           NULL, NULL, NULL, c.block_hash,
           format('block {} cached new content at seq {} without evicting what it held since '
                  'seq {}', c.block_id, c.end_seq, c.start_seq)
    FROM kv_copies c WHERE c.end_kind = 'overwritten'
    UNION ALL
    SELECT run_id, {finding.claim_never_submitted}, {severity.anomaly},
           coalesce(accepted_seq, rejected_seq, release_seq, reported_harm_seq),
           [v FOR v IN [accepted_seq, rejected_seq, release_seq] IF v IS NOT NULL],
           claim_id, claim_seq, NULL, NULL,
           format('claim {} appears in claim events but was never submitted: its state is '
                  {claim_outcome.unknown}, claim_id)
    FROM kv_claim_facts WHERE submitted_seq IS NULL
    UNION ALL
    SELECT f.run_id, {finding.claim_never_decided}, {severity.anomaly}, f.submitted_seq, [f.submitted_seq],
           f.claim_id, f.claim_seq, f.request_id, NULL,
           format('claim {} was submitted at seq {} but never accepted or rejected',
                  f.claim_id, f.submitted_seq)
    FROM kv_claim_facts f JOIN kv_runs r USING (run_id)
    WHERE f.submitted_seq IS NOT NULL AND f.accepted_seq IS NULL AND f.rejected_seq IS NULL
      AND NOT r.has_hole

    -- lifecycle legitimacy (docs/design.md §5 "Lifecycle legitimacy"; stage 02) ------------
    -- NOTE: self-contained block: reads kv_lifecycle_ends, kv_demotion_checks (below the
    -- findings' inputs) and kv_hit_contradictions only
    UNION ALL
    -- an end of force the contract does not allow: the instance stays in force
    SELECT x.run_id, x.broken_rule, {severity.violation}, x.seq, [x.seq], x.claim_id, x.claim_seq,
           x.by_request_id, NULL,
           format('{} of claim {} at seq {} does not end its force: {}; the claim stays in '
                  'force (later losses are judged as if it had not happened)', x.event,
                  x.claim_id, x.seq,
                  CASE x.broken_rule
                      WHEN {finding.demoted_not_demotable} THEN format(
                          'only a demotable claim may be demoted, this one is {}',
                          coalesce(x.protection_mode, '?'))
                      WHEN {finding.expired_not_expiring} THEN format(
                          'only an expiring claim may expire, this one is {}',
                          coalesce(x.protection_mode, '?'))
                      WHEN {finding.expired_without_ttl} THEN 'the claim declared no ttl_s'
                      WHEN {finding.expired_before_ttl} THEN format(
                          'ttl_s {} had not elapsed since its acceptance (at {} ns, expiry at '
                          '{} ns)', x.ttl_s, coalesce(x.accepted_ts_ns::VARCHAR, '?'), x.ts_ns)
                      WHEN {finding.released_not_by_owner} THEN
                          'released_by tenant, but asked by another tenant than the claim''s'
                      WHEN {finding.released_by_arbiter} THEN
                          'the arbiter ends a claim only by demotion or expiry'
                      ELSE 'released_by names neither the operator nor the claim''s tenant'
                  END)
    FROM kv_lifecycle_ends x
    WHERE NOT x.legit
    UNION ALL
    -- the source format never carries what the rule reads: the runtime's word is kept
    SELECT x.run_id, {finding.lifecycle_unverified}, {severity.anomaly}, x.seq, [x.seq], x.claim_id,
           x.claim_seq, x.by_request_id, NULL,
           format('{} of claim {} at seq {} is the runtime''s word: the {} format records no '
                  '{}, so whether the contract allowed it cannot be checked', x.event,
                  x.claim_id, x.seq,
                  CASE x.lifecycle_source WHEN {lifecycle_source.prototype} THEN 'paper prototype'
                       ELSE 'schema-1' END,
                  CASE x.event WHEN {event.claim_expired} THEN 'ttl_s'
                       WHEN {event.claim_demoted} THEN 'claim lifecycle mode'
                       ELSE 'released_by' END)
    FROM kv_lifecycle_ends x
    WHERE NOT x.verified AND x.broken_rule IS NOT NULL
    UNION ALL
    -- a demotion must make room for a named request that could not be admitted without it
    SELECT d.run_id, {finding.demotion_unjustified}, {severity.violation}, d.seq,
           [v FOR v IN [d.seq, d.decision_seq] IF v IS NOT NULL], d.claim_id, d.claim_seq,
           d.by_request_id, NULL,
           CASE WHEN d.by_request_id IS NULL
                    THEN format('claim {} was demoted at seq {} without naming the request it '
                                'made room for (by_request_id)', d.claim_id, d.seq)
                WHEN d.decision_seq IS NULL
                    THEN format('claim {} was demoted at seq {} for request {}, which has no '
                                'admission decision after it in that step', d.claim_id, d.seq,
                                d.by_request_id)
                ELSE format('claim {} was demoted at seq {} for request {}, but the request''s '
                            'admission at seq {} was feasible without it (rebuilt: protected '
                            '{} + {} freed by the demotion + required {} <= usable {})',
                            d.claim_id, d.seq, d.by_request_id, d.decision_seq,
                            d.protected_blocks, d.freed_blocks, d.required_blocks,
                            d.usable_blocks) END
    FROM kv_demotion_checks d
    WHERE NOT d.justified
    UNION ALL
    -- evidence comes from the timeline: a hit on a block that does not hold that content
    SELECT h.run_id, {finding.hit_not_resident}, {severity.disagreement}, h.seq, [h.seq], NULL, NULL,
           h.request_id, h.block_hash,
           format('block_hit at seq {} on block {} with hash {}, but the block held {} there: '
                  'not counted as presence (it repairs no loss)', h.seq, h.block_id,
                  coalesce(h.block_hash::VARCHAR, '?'),
                  coalesce('hash ' || h.held_hash::VARCHAR, 'no cached content'))
    FROM kv_hit_contradictions h JOIN kv_runs r ON r.run_id = h.run_id
    WHERE h.seq < coalesce(r.unknown_from_seq, h.seq + 1)
)
SELECT f.run_id, f.kind, f.severity, f.seq, f.seqs, f.claim_id, f.claim_seq, f.request_id,
       f.block_hash,
       -- NOTE: fail-open: a violation or disagreement after a hook failure names it, so the
       -- policy is not blamed for what a failed hook may have let through
       CASE WHEN f.severity IN ({severity.violation}, {severity.disagreement}) AND f.seq >= r.hook_failed_seq
            THEN f.detail || format(' (after hook {} failed at seq {}: enforcement unknown)',
                                    coalesce(r.hook_failed_hook, '?'), r.hook_failed_seq)
            ELSE f.detail END AS detail
FROM f
LEFT JOIN kv_runs r ON r.run_id = f.run_id;

CREATE OR REPLACE TABLE findings AS
SELECT * FROM kv_findings_rows
-- NOTE: block_hash and detail only break ties (e.g. several blocks lost at one reset)
ORDER BY run_id, seq NULLS LAST, kind, claim_id, claim_seq, request_id, block_hash, detail;

DROP TABLE kv_findings_rows;
