-- Stage 3: claim lifecycle facts, bindings, and the residency of bound content.

CREATE OR REPLACE TEMP TABLE kv_claim_ev AS
SELECT run_id, seq, ts_ns, event, claim_id, tenant, request_id, protection_mode,
       threshold_blocks, ttl_s, value, block_hash, position, reason, by_request_id
FROM events
WHERE claim_id IS NOT NULL AND event LIKE 'claim\_%' ESCAPE '\';

-- One row per claim id seen in any claim event of a run.
CREATE OR REPLACE TEMP TABLE kv_claim_facts AS
WITH f AS (
    SELECT
        run_id, claim_id,
        min(seq) FILTER (WHERE event = 'claim_submitted') AS submitted_seq,
        arg_min(tenant, seq) FILTER (WHERE event = 'claim_submitted') AS tenant,
        arg_min(request_id, seq) FILTER (WHERE event = 'claim_submitted') AS request_id,
        arg_min(protection_mode, seq) FILTER (WHERE event = 'claim_submitted') AS declared_mode,
        arg_min(threshold_blocks, seq) FILTER (WHERE event = 'claim_submitted')
            AS declared_threshold,
        arg_min(ttl_s, seq) FILTER (WHERE event = 'claim_submitted') AS ttl_s,
        arg_min(value, seq) FILTER (WHERE event = 'claim_submitted') AS declared_value,
        min(seq) FILTER (WHERE event = 'claim_accepted') AS accepted_seq,
        arg_min(ts_ns, seq) FILTER (WHERE event = 'claim_accepted') AS accepted_ts_ns,
        min(seq) FILTER (WHERE event = 'claim_rejected') AS rejected_seq,
        arg_min(reason, seq) FILTER (WHERE event = 'claim_rejected') AS reject_reason,
        min(seq) FILTER (WHERE event = 'claim_demoted') AS demoted_seq,
        min(seq) FILTER (WHERE event = 'claim_expired') AS expired_seq,
        arg_min(ts_ns, seq) FILTER (WHERE event = 'claim_expired') AS expired_ts_ns,
        min(seq) FILTER (WHERE event = 'claim_released') AS released_seq,
        min(seq) FILTER (WHERE event = 'claim_materialized') AS reported_materialized_seq,
        list(seq ORDER BY seq) FILTER (WHERE event = 'claim_materialized')
            AS reported_materialized_seqs,
        min(seq) FILTER (WHERE event = 'claim_harmed') AS reported_harm_seq,
        list(seq ORDER BY seq) FILTER (WHERE event = 'claim_harmed') AS reported_harm_seqs,
        count(DISTINCT position) FILTER (WHERE event = 'claim_bound' AND position >= 0)
            AS positions_bound,
        max(position) FILTER (WHERE event = 'claim_bound') AS max_position
    FROM kv_claim_ev
    GROUP BY run_id, claim_id
)
SELECT
    f.*,
    -- a claim that states no mode gets its run policy's default mode (recorder/policies.py)
    coalesce(f.declared_mode, p.default_mode) AS protection_mode,
    coalesce(r.enforcing, false) AND coalesce(f.declared_mode, p.default_mode) IN
        ('hard_protected', 'demotable', 'expiring') AS pinned_mode,
    -- NOTE: leading_prefix_at_least(k); without a declared threshold the claim covers every
    -- bound position (the arbiter does the same: threshold = number of bound blocks).
    coalesce(declared_threshold, max_position + 1) AS k,
    coalesce(declared_value, 1.0) AS value,
    -- The release that ended the claim's force: the first of demote/expire/release.
    least(demoted_seq, expired_seq, released_seq) AS release_seq,
    CASE least(demoted_seq, expired_seq, released_seq)
        WHEN demoted_seq THEN 'claim_demoted'
        WHEN expired_seq THEN 'claim_expired'
        WHEN released_seq THEN 'claim_released'
    END AS release_event
FROM f
LEFT JOIN kv_runs r ON r.run_id = f.run_id
LEFT JOIN kv_policies p ON p.policy = r.policy;

-- Which content a claim covers at which position, valid from bound_seq until the position
-- is bound again (unbound_seq; NULL = still bound).
CREATE OR REPLACE TEMP TABLE kv_bindings AS
SELECT run_id, claim_id, position, block_hash, seq AS bound_seq,
       lead(seq) OVER (PARTITION BY run_id, claim_id, position ORDER BY seq) AS unbound_seq
FROM kv_claim_ev
WHERE event = 'claim_bound' AND block_hash IS NOT NULL AND position >= 0;

-- Copies of bound content only: the predicate never needs anything else.
CREATE OR REPLACE TEMP TABLE kv_bound_copies AS
SELECT c.*
FROM kv_copies c
SEMI JOIN (SELECT DISTINCT run_id, block_hash FROM kv_bindings) b
    ON b.run_id = c.run_id AND b.block_hash = c.block_hash;

-- Number of copies of each bound hash after each seq where it changes.
CREATE OR REPLACE TEMP TABLE kv_hash_copies AS
WITH d AS (
    SELECT run_id, block_hash, start_seq AS seq, 1 AS delta FROM kv_bound_copies
    UNION ALL
    SELECT run_id, block_hash, end_seq AS seq, -1 AS delta
    FROM kv_bound_copies WHERE end_seq IS NOT NULL
), agg AS (
    SELECT run_id, block_hash, seq, sum(delta) AS delta FROM d GROUP BY ALL
)
SELECT run_id, block_hash, seq,
       sum(delta) OVER (PARTITION BY run_id, block_hash ORDER BY seq) AS copies
FROM agg;

-- Intervals [from_seq, to_seq) during which at least one copy of a bound hash is resident.
CREATE OR REPLACE TEMP TABLE kv_resident AS
WITH flags AS (
    SELECT run_id, block_hash, seq, copies > 0 AS res,
           lag(copies > 0, 1, false) OVER (PARTITION BY run_id, block_hash ORDER BY seq)
               AS prev_res
    FROM kv_hash_copies
), edges AS (
    SELECT run_id, block_hash, seq, res,
           lead(seq) OVER (PARTITION BY run_id, block_hash ORDER BY seq) AS next_edge
    FROM flags
    WHERE res <> prev_res
)
SELECT run_id, block_hash, seq AS from_seq, next_edge AS to_seq
FROM edges
WHERE res;

-- For each claim position below k: intervals where its bound content is resident.
CREATE OR REPLACE TEMP TABLE kv_pos_ok AS
SELECT b.run_id, b.claim_id, b.position,
       greatest(b.bound_seq, r.from_seq) AS from_seq,
       least(b.unbound_seq, r.to_seq) AS to_seq
FROM kv_bindings b
JOIN kv_claim_facts f ON f.run_id = b.run_id AND f.claim_id = b.claim_id
JOIN kv_resident r ON r.run_id = b.run_id AND r.block_hash = b.block_hash
WHERE b.position < f.k
  AND (r.to_seq IS NULL OR r.to_seq > b.bound_seq)
  AND (b.unbound_seq IS NULL OR r.from_seq < b.unbound_seq);

-- Intervals [from_seq, to_seq) during which a claim's predicate holds: every position
-- 0..k-1 bound and resident (NOTE: positions, never a count of surviving blocks — L6).
CREATE OR REPLACE TEMP TABLE kv_pred AS
WITH d AS (
    SELECT run_id, claim_id, from_seq AS seq, 1 AS delta FROM kv_pos_ok
    UNION ALL
    SELECT run_id, claim_id, to_seq AS seq, -1 AS delta FROM kv_pos_ok WHERE to_seq IS NOT NULL
), agg AS (
    SELECT run_id, claim_id, seq, sum(delta) AS delta FROM d GROUP BY ALL
), running AS (
    SELECT a.run_id, a.claim_id, a.seq,
           sum(a.delta) OVER (PARTITION BY a.run_id, a.claim_id ORDER BY a.seq) AS ok
    FROM agg a
), flags AS (
    SELECT r.run_id, r.claim_id, r.seq, r.ok >= f.k AS holds,
           lag(r.ok >= f.k, 1, false) OVER (PARTITION BY r.run_id, r.claim_id ORDER BY r.seq)
               AS prev_holds
    FROM running r
    JOIN kv_claim_facts f ON f.run_id = r.run_id AND f.claim_id = r.claim_id
    WHERE f.k >= 1
), edges AS (
    SELECT run_id, claim_id, seq, holds,
           lead(seq) OVER (PARTITION BY run_id, claim_id ORDER BY seq) AS next_edge
    FROM flags
    WHERE holds <> prev_holds
)
SELECT run_id, claim_id, seq AS from_seq, next_edge AS to_seq,
       -- the end of the claim's previous interval (NULL for its first)
       lag(next_edge) OVER (PARTITION BY run_id, claim_id ORDER BY seq) AS prev_to_seq
FROM edges
WHERE holds;

-- First seq at which the predicate held while the claim was in force (accepted, not yet
-- released): "materialized" in DESIGN §2. NULL = never.
CREATE OR REPLACE TEMP TABLE kv_materialized AS
SELECT f.run_id, f.claim_id, min(greatest(p.from_seq, f.accepted_seq)) AS materialized_seq
FROM kv_claim_facts f
JOIN kv_pred p ON p.run_id = f.run_id AND p.claim_id = f.claim_id
WHERE f.accepted_seq IS NOT NULL
  AND (p.to_seq IS NULL OR p.to_seq > f.accepted_seq)
  AND (f.release_seq IS NULL OR greatest(p.from_seq, f.accepted_seq) < f.release_seq)
GROUP BY ALL;
