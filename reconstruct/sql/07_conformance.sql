-- Stage 7: conformance litmus L1..L7 and invariants (DESIGN §5), one row per run and check.
-- Each check yields: applicable, failed, the seqs that prove the verdict, and a detail line.
-- Verdict: fail if failed; else unknown if the run has a hole (a hidden event could change
-- it); else not_applicable / pass. Exact rules: docs/reconstruction.md "Conformance".

CREATE OR REPLACE TABLE conformance AS
WITH fk AS (
    SELECT run_id, kind, list(seq ORDER BY seq) AS seqs, count(*) AS n
    FROM findings GROUP BY run_id, kind
), fails AS (
    -- the finding kinds that fail each check
    SELECT * FROM (VALUES
        ('L1', 'harm_without_acceptance'),
        ('L3', 'infeasible_admission'), ('L3', 'protected_block_lost'),
        ('L3', 'refusal_without_blocking_claim'), ('L3', 'refusal_names_unknown_claim'),
        ('L3', 'refusal_names_claim_not_in_force'), ('L3', 'refusal_names_unmaterialized_claim'),
        ('L3', 'refusal_names_unprotected_claim'),
        ('L4', 'loss_before_release'), ('L5', 'loss_before_release'),
        ('L6', 'materialized_reported_predicate_false'),
        ('L7', 'harm_not_reported'), ('L7', 'harm_reported_not_reconstructed'),
        ('L7', 'harm_reported_before_loss'), ('L7', 'materialized_reported_predicate_false'),
        ('L7', 'materialization_not_reported'), ('L7', 'shortfall_mismatch'),
        ('INV_no_harm_without_acceptance', 'harm_without_acceptance'),
        ('INV_release_precedes_loss', 'loss_before_release'),
        ('INV_release_precedes_loss', 'label_without_prior_release'),
        ('INV_refusal_names_protected_claim', 'refusal_without_blocking_claim'),
        ('INV_refusal_names_protected_claim', 'refusal_names_unknown_claim'),
        ('INV_refusal_names_protected_claim', 'refusal_names_claim_not_in_force'),
        ('INV_refusal_names_protected_claim', 'refusal_names_unmaterialized_claim'),
        ('INV_refusal_names_protected_claim', 'refusal_names_unprotected_claim'),
        ('INV_no_protected_loss', 'protected_block_lost'),
        ('INV_feasible_admission', 'infeasible_admission')
    ) t(check_name, kind)
), failing AS (
    SELECT f.check_name, k.run_id, flatten(list(k.seqs ORDER BY k.kind)) AS seqs,
           string_agg(k.kind || ' x' || k.n, ', ' ORDER BY k.kind) AS kinds
    FROM fails f JOIN fk k ON k.kind = f.kind
    GROUP BY f.check_name, k.run_id
), c AS (
    SELECT * FROM kv_claim_facts
), uncovered AS (
    -- L1: losses not covered by any claim accepted before them (one pass, per run)
    SELECT l.run_id, count(*) AS n, min(l.seq, 10) AS first_seqs
    FROM losses l
    WHERE NOT EXISTS (SELECT 1 FROM loss_claims x
                      WHERE x.run_id = l.run_id AND x.seq = l.seq AND x.block_id = l.block_id
                        AND x.accepted_seq < x.seq)
    GROUP BY l.run_id
), uncovered_harm AS (
    SELECT l.run_id, count(*) AS n
    FROM losses l
    WHERE l.label = 'harm'
      AND NOT EXISTS (SELECT 1 FROM loss_claims x
                      WHERE x.run_id = l.run_id AND x.seq = l.seq
                        AND x.block_id = l.block_id AND x.label = 'harm'
                        AND x.accepted_seq < x.seq)
    GROUP BY l.run_id
), raw AS (
    -- L1: no accepted claim -> no harm -------------------------------------------------------
    SELECT r.run_id, 'L1' AS check_name,
           u.n IS NOT NULL
           OR EXISTS (SELECT 1 FROM kv_claim_ev e WHERE e.run_id = r.run_id
                      AND e.event = 'claim_harmed') AS applicable,
           uh.n IS NOT NULL AS extra_fail,
           -- the 10 smallest seqs, ascending
           u.first_seqs AS pass_seqs,
           format('{} losses without an accepted claim, none labelled harm', coalesce(u.n, 0))
               AS pass_detail
    FROM kv_runs r
    LEFT JOIN uncovered u ON u.run_id = r.run_id
    LEFT JOIN uncovered_harm uh ON uh.run_id = r.run_id
    UNION ALL
    -- L2: write no-admit serves the active request, yet residents are still evicted ----------
    SELECT r.run_id, 'L2',
           EXISTS (SELECT 1 FROM requests q WHERE q.run_id = r.run_id AND q.reuse_denied),
           EXISTS (SELECT 1 FROM requests q WHERE q.run_id = r.run_id AND q.reuse_denied
                     AND (q.outcome NOT IN ('served', 'deferred_then_served', 'unknown')
                          OR EXISTS (SELECT 1 FROM events e
                                     WHERE e.run_id = q.run_id AND e.event = 'block_cached'
                                       AND e.request_id = q.request_id
                                       AND e.seq > q.reuse_denied_seq))),
           (SELECT flatten(list([q.reuse_denied_seq, q.finished_seq]))
            FROM requests q WHERE q.run_id = r.run_id AND q.reuse_denied),
           (SELECT format('{} write-no-admit request(s) served; {} resident block(s) still '
                          'evicted while they ran', count(*),
                          (SELECT count(*) FROM losses l WHERE l.run_id = r.run_id
                             AND l.by_request_id IN (SELECT request_id FROM requests q2
                                                     WHERE q2.run_id = r.run_id
                                                       AND q2.reuse_denied)))
            FROM requests q WHERE q.run_id = r.run_id AND q.reuse_denied)
    FROM kv_runs r
    UNION ALL
    -- L3: an accepted hard claim turns infeasibility into a refusal naming it; no block lost --
    SELECT r.run_id, 'L3',
           r.enforcing AND EXISTS (SELECT 1 FROM c WHERE c.run_id = r.run_id
                                   AND c.protection_mode = 'hard_protected'
                                   AND c.accepted_seq IS NOT NULL),
           EXISTS (SELECT 1 FROM claims x WHERE x.run_id = r.run_id
                     AND x.protection_mode = 'hard_protected' AND x.outcome = 'harmed')
           OR EXISTS (SELECT 1 FROM feasibility f WHERE f.run_id = r.run_id AND NOT f.feasible
                        AND f.decision IN ('deferred', 'refused')
                        AND NOT EXISTS (
                            SELECT 1 FROM c WHERE c.run_id = f.run_id
                              AND c.protection_mode = 'hard_protected'
                              AND list_contains(f.blocking_claim_ids, c.claim_id))),
           (SELECT flatten(list([f.seq, c.accepted_seq])) FROM feasibility f
            JOIN c ON c.run_id = f.run_id AND list_contains(f.blocking_claim_ids, c.claim_id)
            WHERE f.run_id = r.run_id AND f.decision = 'refused'),
           (SELECT format('{} refusal(s) naming the hard claim(s), shortfall {}; {} hard-claim '
                          'block(s) lost', count(*), max(f.shortfall_blocks),
                          (SELECT coalesce(sum(x.blocks_lost_harm + x.blocks_lost_eviction), 0)
                           FROM claims x WHERE x.run_id = r.run_id
                             AND x.protection_mode = 'hard_protected'))
            FROM feasibility f WHERE f.run_id = r.run_id AND f.decision = 'refused')
    FROM kv_runs r
    UNION ALL
    -- L4 / L5: a demotion (expiry) strictly precedes every later loss: relaxation (expiry) ----
    SELECT r.run_id, t.check_name,
           EXISTS (SELECT 1 FROM c WHERE c.run_id = r.run_id AND c.release_event = t.ev),
           EXISTS (SELECT 1 FROM loss_claims x JOIN c ON c.run_id = x.run_id
                     AND c.claim_id = x.claim_id
                   WHERE x.run_id = r.run_id AND c.release_event = t.ev AND x.label = 'harm')
           OR (t.ev = 'claim_expired' AND EXISTS (
                SELECT 1 FROM c WHERE c.run_id = r.run_id AND c.release_event = t.ev
                  AND c.ttl_s IS NOT NULL
                  AND c.expired_ts_ns < c.accepted_ts_ns + CAST(c.ttl_s * 1e9 AS BIGINT))),
           (SELECT flatten(list([c.release_seq, (SELECT min(x.seq) FROM loss_claims x
                                               WHERE x.run_id = c.run_id
                                                 AND x.claim_id = c.claim_id
                                                 AND x.label = t.label)]))
            FROM c WHERE c.run_id = r.run_id AND c.release_event = t.ev),
           (SELECT format('{} {} claim(s); {} later loss(es) labelled {}, none harm', count(*),
                          t.ev, (SELECT count(*) FROM loss_claims x WHERE x.run_id = r.run_id
                                   AND x.label = t.label), t.label)
            FROM c WHERE c.run_id = r.run_id AND c.release_event = t.ev)
    FROM kv_runs r,
         (VALUES ('L4', 'claim_demoted', 'relaxation'),
                 ('L5', 'claim_expired', 'expiry')) t(check_name, ev, label)
    UNION ALL
    -- L6: surviving block count is not the predicate ----------------------------------------
    SELECT r.run_id, 'L6',
           EXISTS (SELECT 1 FROM kv_claim_ev e WHERE e.run_id = r.run_id
                     AND e.event = 'claim_materialized')
           OR EXISTS (SELECT 1 FROM claims x WHERE x.run_id = r.run_id
                        AND x.accepted_seq IS NOT NULL AND x.materialized_seq IS NULL),
           EXISTS (SELECT 1 FROM claims x WHERE x.run_id = r.run_id
                     AND x.materialized_seq IS NULL AND x.reported_harm_seq IS NOT NULL),
           (SELECT flatten(list([v FOR v IN [x.accepted_seq, x.materialized_seq,
                                             x.reported_materialized_seq] IF v IS NOT NULL]))
            FROM claims x WHERE x.run_id = r.run_id AND x.accepted_seq IS NOT NULL),
           (SELECT format('{} accepted claim(s): {} materialized (all leading positions '
                          'resident), {} never', count(*), count(x.materialized_seq),
                          count(*) - count(x.materialized_seq))
            FROM claims x WHERE x.run_id = r.run_id AND x.accepted_seq IS NOT NULL)
    FROM kv_runs r
    UNION ALL
    -- L7: the outcome reconstructed from the trace equals what the runtime reported ----------
    SELECT r.run_id, 'L7',
           EXISTS (SELECT 1 FROM events e WHERE e.run_id = r.run_id
                     AND e.event IN ('claim_harmed', 'claim_materialized', 'request_refused'))
           OR EXISTS (SELECT 1 FROM claims x WHERE x.run_id = r.run_id
                        AND x.outcome = 'harmed'),
           false,
           (SELECT flatten(list([v FOR v IN [x.first_harm_seq, x.reported_harm_seq,
                                             x.materialized_seq, x.reported_materialized_seq]
                                 IF v IS NOT NULL]))
            FROM claims x WHERE x.run_id = r.run_id),
           'every runtime report (claim_harmed, claim_materialized, refusals) agrees with the '
           'reconstruction, in order'
    FROM kv_runs r
    UNION ALL
    -- invariants ------------------------------------------------------------------------------
    SELECT r.run_id, 'INV_no_harm_without_acceptance',
           EXISTS (SELECT 1 FROM kv_claim_ev e WHERE e.run_id = r.run_id
                     AND e.event = 'claim_harmed')
           OR EXISTS (SELECT 1 FROM loss_claims x WHERE x.run_id = r.run_id
                        AND x.label = 'harm'),
           false, NULL, 'every harm (reported or reconstructed) follows its claim''s acceptance'
    FROM kv_runs r
    UNION ALL
    SELECT r.run_id, 'INV_release_precedes_loss',
           EXISTS (SELECT 1 FROM c WHERE c.run_id = r.run_id AND c.release_seq IS NOT NULL),
           false,
           (SELECT list(c.release_seq ORDER BY c.release_seq) FROM c
            WHERE c.run_id = r.run_id AND c.release_seq IS NOT NULL),
           'every relaxation/expiry loss is strictly after its release; no harm before it'
    FROM kv_runs r
    UNION ALL
    SELECT r.run_id, 'INV_refusal_names_protected_claim',
           EXISTS (SELECT 1 FROM feasibility f WHERE f.run_id = r.run_id
                     AND f.decision = 'refused'),
           false,
           (SELECT list(f.seq ORDER BY f.seq) FROM feasibility f
            WHERE f.run_id = r.run_id AND f.decision = 'refused'),
           'every refusal names in-force, materialized, protected claims'
    FROM kv_runs r
    UNION ALL
    SELECT r.run_id, 'INV_no_protected_loss',
           EXISTS (SELECT 1 FROM c WHERE c.run_id = r.run_id AND c.pinned_mode
                     AND c.accepted_seq IS NOT NULL),
           false, NULL,
           'no block of an in-force protected claim is lost under an enforcing policy'
    FROM kv_runs r
    UNION ALL
    SELECT r.run_id, 'INV_feasible_admission',
           r.enforcing AND EXISTS (SELECT 1 FROM feasibility f WHERE f.run_id = r.run_id
                                     AND f.decision = 'admitted'),
           false,
           NULL,
           'protected + required <= usable at every admission under an enforcing policy'
    FROM kv_runs r
)
SELECT
    raw.run_id, raw.check_name AS "check",
    CASE
        WHEN fl.run_id IS NOT NULL OR (raw.applicable AND raw.extra_fail) THEN 'fail'
        WHEN r.has_hole THEN 'unknown'
        WHEN NOT raw.applicable THEN 'not_applicable'
        ELSE 'pass'
    END AS verdict,
    CASE WHEN fl.run_id IS NOT NULL OR (raw.applicable AND raw.extra_fail)
         THEN coalesce(fl.seqs, raw.pass_seqs) ELSE coalesce(raw.pass_seqs, []::BIGINT[])
    END AS evidence_seqs,
    CASE WHEN fl.run_id IS NOT NULL THEN 'failing findings: ' || fl.kinds
         WHEN raw.applicable AND raw.extra_fail
             THEN 'the trace contradicts the rule (see evidence seqs)'
         WHEN r.has_hole AND raw.applicable
             THEN 'no violation seen, but the run has a hole from seq '
                  || coalesce(r.unknown_from_seq::VARCHAR, 'its truncation')
         WHEN r.has_hole THEN 'not applicable to the events held, but the run has a hole'
         WHEN NOT raw.applicable THEN 'not applicable'
         ELSE coalesce(raw.pass_detail, 'no violation') END AS detail
FROM raw
JOIN kv_runs r ON r.run_id = raw.run_id
LEFT JOIN failing fl ON fl.run_id = raw.run_id AND fl.check_name = raw.check_name
ORDER BY raw.run_id,
         CASE WHEN raw.check_name LIKE 'L%' THEN 0 ELSE 1 END, raw.check_name;
