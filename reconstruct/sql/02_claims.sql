-- Stage 2: claim instances and their lifecycle facts (docs/reconstruction.md, "Claim instances").
-- NOTE: every claim_submitted starts a new instance of its claim_id; every later event with that
-- id belongs to the latest instance. claim_seq (the instance's key, next to claim_id) is the seq
-- of its claim_submitted, or, for events of an id before any submit (imports, broken traces),
-- the seq of the first event with that id. Joins use (run_id, claim_seq).

CREATE OR REPLACE TEMP TABLE kv_claim_ev AS
SELECT run_id, seq, ts_ns, step, event, claim_id,
       coalesce(max(CASE WHEN event = 'claim_submitted' THEN seq END) OVER (
                    PARTITION BY run_id, claim_id ORDER BY seq
                    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW),
                min(seq) OVER (PARTITION BY run_id, claim_id)) AS claim_seq,
       tenant, request_id, protection_mode, threshold_blocks, ttl_s, value, block_hash,
       position, reason, by_request_id
FROM events
WHERE claim_id IS NOT NULL AND event LIKE 'claim\_%' ESCAPE '\';

-- One row per claim instance.
CREATE OR REPLACE TEMP TABLE kv_claim_facts AS
WITH f AS (
    SELECT
        run_id, claim_seq, any_value(claim_id) AS claim_id,
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
        max(position) FILTER (WHERE event = 'claim_bound') AS max_position,
        -- slots of the labelling pass: positions a usable binding can take
        coalesce(max(position) FILTER (WHERE event = 'claim_bound' AND position >= 0
                                         AND block_hash IS NOT NULL), -1) + 1 AS n_slots
    FROM kv_claim_ev
    GROUP BY run_id, claim_seq
)
SELECT
    f.*,
    -- a claim that states no mode gets its run policy's default mode (kvclaims/contract/policies.py)
    coalesce(f.declared_mode, p.default_mode) AS protection_mode,
    coalesce(r.enforcing, false) AND coalesce(f.declared_mode, p.default_mode) IN
        ('hard_protected', 'demotable', 'expiring') AS pinned_mode,
    -- NOTE: leading_prefix_at_least(k); without a declared threshold the claim covers every
    -- bound position (the arbiter does the same: threshold = number of bound blocks).
    coalesce(declared_threshold, max_position + 1) AS k,
    coalesce(declared_value, 1.0) AS value,
    -- The release that ended the instance's force: the first of demote/expire/release.
    least(demoted_seq, expired_seq, released_seq) AS release_seq,
    CASE least(demoted_seq, expired_seq, released_seq)
        WHEN demoted_seq THEN 'claim_demoted'
        WHEN expired_seq THEN 'claim_expired'
        WHEN released_seq THEN 'claim_released'
    END AS release_event
FROM f
LEFT JOIN kv_runs r ON r.run_id = f.run_id
LEFT JOIN kv_policies p ON p.policy = r.policy;
