-- capacity_sweep: one row per run of a sweep: the scenario, its policy and pool size, what
-- happened to the active request, and how many resident blocks were lost under which label.
-- The "active" request is the one whose admission decision came last (the pressure point);
-- no request naming convention is assumed. Needs `feasibility`, `requests`, `losses`.
CREATE OR REPLACE VIEW capacity_sweep AS
WITH active AS (
    SELECT run_id, arg_max(request_id, seq) AS request_id
    FROM feasibility GROUP BY run_id
), runs AS (
    SELECT DISTINCT run_id FROM requests
    UNION SELECT DISTINCT run_id FROM losses
)
SELECT
    -- the run (scenario) id
    r.run_id AS scenario,
    -- the run policy (run_started)
    (SELECT max(policy) FROM feasibility f WHERE f.run_id = r.run_id) AS policy,
    -- usable blocks in the pool
    (SELECT max(usable_blocks) FROM feasibility f WHERE f.run_id = r.run_id) AS usable_blocks,
    -- the active request's id
    a.request_id AS active_request_id,
    -- its outcome: served | deferred_then_served | refused | ...
    q.outcome AS active_outcome,
    -- blocks it was short of at its refusal (NULL unless refused)
    q.shortfall_blocks AS shortfall_blocks,
    -- the claims its refusal named
    q.blocking_claim_ids,
    -- resident blocks lost in the run (every label)
    (SELECT count(*) FROM losses l WHERE l.run_id = r.run_id) AS resident_blocks_lost,
    -- of which harm
    (SELECT count(*) FROM losses l WHERE l.run_id = r.run_id AND l.label = 'harm') AS harm,
    -- of which expiry
    (SELECT count(*) FROM losses l WHERE l.run_id = r.run_id AND l.label = 'expiry') AS expiry,
    -- of which relaxation
    (SELECT count(*) FROM losses l WHERE l.run_id = r.run_id AND l.label = 'relaxation')
        AS relaxation,
    -- of which plain eviction
    (SELECT count(*) FROM losses l WHERE l.run_id = r.run_id AND l.label = 'eviction')
        AS eviction,
    -- of which unknown (behind a hole in the evidence)
    (SELECT count(*) FROM losses l WHERE l.run_id = r.run_id AND l.label = 'unknown')
        AS unknown
FROM runs r
LEFT JOIN active a ON a.run_id = r.run_id
LEFT JOIN requests q ON q.run_id = a.run_id AND q.request_id = a.request_id
ORDER BY policy NULLS LAST, usable_blocks NULLS LAST, scenario;
