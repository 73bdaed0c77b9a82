-- capacity_sweep: one row per run of a capacity sweep: its policy and pool size, what happened
-- to the active request, how many resident blocks were lost, and under which label.
-- Roles come from the trace, never from request names: the *active* request is the one with the
-- largest admission demand (`blocks_required`, the earliest on a tie) and the *resident* blocks
-- lost are the cached blocks its allocation evicted (`by_request_id`), claimed or not. Needs
-- `feasibility`, `requests`, `losses`, `claims`.
CREATE OR REPLACE VIEW capacity_sweep AS
WITH active AS (
    SELECT run_id, request_id
    FROM (SELECT run_id, request_id,
                 row_number() OVER (PARTITION BY run_id
                                    ORDER BY blocks_required DESC, seq) AS rank
          FROM feasibility)
    WHERE rank = 1
), runs AS (
    SELECT DISTINCT run_id, policy, usable_blocks FROM feasibility
), resident AS (
    SELECT l.run_id,
           count(*) FILTER (WHERE l.by_request_id = a.request_id) AS lost,
           count(*) FILTER (WHERE l.by_request_id = a.request_id AND label = {label.harm}) AS harm,
           count(*) FILTER (WHERE l.by_request_id = a.request_id AND label = {label.expiry}) AS expiry,
           count(*) FILTER (WHERE l.by_request_id = a.request_id AND label = {label.relaxation})
               AS relaxation,
           count(*) FILTER (WHERE l.by_request_id = a.request_id AND label = {label.eviction})
               AS eviction,
           count(*) FILTER (WHERE l.by_request_id = a.request_id AND label = {label.unknown})
               AS unknown,
           count(*) AS all_lost
    FROM losses l LEFT JOIN active a ON a.run_id = l.run_id
    GROUP BY l.run_id
), outcomes AS (
    SELECT run_id,
           string_agg(claim_id || '=' || outcome, ',' ORDER BY claim_id) AS claim_outcome
    FROM claims GROUP BY run_id
)
SELECT
    -- the run
    r.run_id,
    -- the run policy (run_started)
    r.policy,
    -- usable blocks in the pool (vLLM's null block excluded)
    r.usable_blocks,
    -- the active request's id (largest admission demand)
    a.request_id AS active_request_id,
    -- its outcome: served | deferred_then_served | refused | preempted | aborted | unknown
    q.outcome AS active_outcome,
    -- blocks it was short of at its refusal (NULL unless refused)
    q.shortfall_blocks,
    -- the claims its refusal named (NULL unless refused)
    q.blocking_claim_ids,
    -- cached blocks the active request's allocation evicted, every label
    coalesce(s.lost, 0) AS resident_blocks_lost,
    -- every claim's final outcome, as claim_id=outcome, comma-separated
    o.claim_outcome,
    -- of those, lost as harm
    coalesce(s.harm, 0) AS harm,
    -- of those, lost after expiry
    coalesce(s.expiry, 0) AS expiry,
    -- of those, lost after a demotion or release
    coalesce(s.relaxation, 0) AS relaxation,
    -- of those, lost without breaking a claim in force
    coalesce(s.eviction, 0) AS eviction,
    -- of those, lost behind a hole in the evidence
    coalesce(s.unknown, 0) AS unknown,
    -- every block lost in the run, by any request
    coalesce(s.all_lost, 0) AS blocks_lost
FROM runs r
LEFT JOIN active a ON a.run_id = r.run_id
LEFT JOIN requests q ON q.run_id = a.run_id AND q.request_id = a.request_id
LEFT JOIN resident s ON s.run_id = r.run_id
LEFT JOIN outcomes o ON o.run_id = r.run_id
ORDER BY r.policy, r.usable_blocks, r.run_id;
