-- Stage 4: label every block loss (DESIGN §4).

-- One row per (loss, claim bound to the lost content at the time of the loss).
CREATE OR REPLACE TABLE loss_claims AS
WITH pairs AS (
    SELECT l.run_id, l.seq, l.ts_ns, l.block_id, l.block_hash, l.by_request_id,
           b.claim_id, min(b.position) AS position
    FROM kv_losses l
    JOIN kv_bindings b
      ON b.run_id = l.run_id AND b.block_hash = l.block_hash
     AND b.bound_seq < l.seq AND (b.unbound_seq IS NULL OR b.unbound_seq > l.seq)
    -- NOTE: `bound` is false only for content surely bound to no claim (stage 2's pre-filter)
    WHERE l.bound
    GROUP BY ALL
), ev AS (
    SELECT
        p.*,
        f.submitted_seq, f.tenant, f.protection_mode, f.k AS threshold_blocks,
        f.accepted_seq, f.release_seq, f.release_event, m.materialized_seq,
        r.unknown_from_seq,
        -- The predicate just before and just after this loss (all events at this seq
        -- applied): q is the claim's last predicate interval starting at or before the loss.
        -- NOTE: a claim's intervals are disjoint and never touch (prev.to_seq < from_seq), so
        -- q alone decides: held just before iff q started before the loss and had not ended
        -- before it; held just after iff q has not ended at the loss.
        coalesce(q.from_seq < p.seq AND (q.to_seq IS NULL OR q.to_seq >= p.seq), false)
            AS predicate_before,
        q.from_seq IS NOT NULL AND (q.to_seq IS NULL OR q.to_seq > p.seq) AS predicate_after,
        -- the loss that made the predicate false most recently (at or before this loss):
        -- q's end if that is at or before the loss, else the end of the interval before q
        CASE WHEN q.to_seq <= p.seq THEN q.to_seq ELSE q.prev_to_seq END AS broken_seq
    FROM pairs p
    JOIN kv_runs r ON r.run_id = p.run_id
    JOIN kv_claim_facts f ON f.run_id = p.run_id AND f.claim_id = p.claim_id
    LEFT JOIN kv_materialized m ON m.run_id = p.run_id AND m.claim_id = p.claim_id
    ASOF LEFT JOIN kv_pred q
      ON q.run_id = p.run_id AND q.claim_id = p.claim_id AND p.seq >= q.from_seq
), lab AS (
    SELECT
        ev.*,
        CASE
            -- NOTE: never guess: a hidden event could change anything after a hole
            WHEN seq >= unknown_from_seq THEN 'unknown'
            -- bound or accepted, but never submitted: its state cannot be established
            WHEN submitted_seq IS NULL THEN 'unknown'
            WHEN accepted_seq IS NULL OR accepted_seq > seq THEN 'eviction'
            WHEN release_seq < seq AND release_event = 'claim_expired' THEN 'expiry'
            WHEN release_seq < seq THEN 'relaxation'
            WHEN materialized_seq < seq AND NOT predicate_after THEN 'harm'
            ELSE 'eviction'
        END AS label
    FROM ev
)
SELECT
    run_id, seq, ts_ns, block_id, block_hash, claim_id, position, label,
    CASE label
        WHEN 'harm' THEN accepted_seq
        WHEN 'expiry' THEN release_seq
        WHEN 'relaxation' THEN release_seq
    END AS decided_by_seq,
    tenant, protection_mode, threshold_blocks, accepted_seq, materialized_seq,
    release_seq, release_event, predicate_before, predicate_after,
    (predicate_before AND NOT predicate_after) AS breaks_predicate,
    CASE WHEN label = 'harm' THEN broken_seq END AS broken_seq,
    by_request_id
FROM lab
ORDER BY run_id, seq, block_id, claim_id;

-- One row per block loss with the most severe label of its claims
-- (harm > unknown > expiry > relaxation > eviction).
CREATE OR REPLACE TABLE losses AS
WITH per_loss AS (
    SELECT run_id, seq, block_id,
           list(claim_id ORDER BY claim_id) AS claim_ids,
           first(label ORDER BY
               CASE label WHEN 'harm' THEN 5 WHEN 'unknown' THEN 4 WHEN 'expiry' THEN 3
                          WHEN 'relaxation' THEN 2 ELSE 1 END DESC, claim_id) AS label,
           first(decided_by_seq ORDER BY
               CASE label WHEN 'harm' THEN 5 WHEN 'unknown' THEN 4 WHEN 'expiry' THEN 3
                          WHEN 'relaxation' THEN 2 ELSE 1 END DESC, claim_id) AS decided_by_seq,
           first(claim_id ORDER BY
               CASE label WHEN 'harm' THEN 5 WHEN 'unknown' THEN 4 WHEN 'expiry' THEN 3
                          WHEN 'relaxation' THEN 2 ELSE 1 END DESC, claim_id) AS decided_by_claim_id
    FROM loss_claims
    GROUP BY run_id, seq, block_id
)
SELECT
    l.run_id, l.seq, l.ts_ns, l.block_id, l.block_hash, l.cause, l.by_request_id,
    CASE
        WHEN l.seq >= r.unknown_from_seq THEN 'unknown'
        -- content that cannot be resolved could be bound to any claim
        WHEN l.block_hash IS NULL THEN 'unknown'
        ELSE coalesce(p.label, 'eviction')
    END AS label,
    coalesce(p.claim_ids, []::VARCHAR[]) AS claim_ids,
    CASE WHEN l.seq >= r.unknown_from_seq OR l.block_hash IS NULL THEN NULL
         ELSE p.decided_by_seq END AS decided_by_seq,
    CASE WHEN l.seq >= r.unknown_from_seq OR l.block_hash IS NULL THEN NULL
         WHEN p.label IN ('harm', 'expiry', 'relaxation') THEN p.decided_by_claim_id
    END AS decided_by_claim_id,
    l.was_resident,
    l.synthetic
FROM kv_losses l
JOIN kv_runs r ON r.run_id = l.run_id
LEFT JOIN per_loss p ON p.run_id = l.run_id AND p.seq = l.seq AND p.block_id = l.block_id
ORDER BY l.run_id, l.seq, l.block_id;
