-- fleet_capacity_by_policy: what each run policy did with the pool's capacity, over every run of
-- a fleet dataset: requests served, deferred and refused, admissions the pool could not hold,
-- claims harmed. One row per policy (NULL: a run without one). One SQL text for Spark SQL and
-- DuckDB alike (docs/fleet.md). Needs `manifests`, `requests`, `feasibility`, `claims`.
CREATE OR REPLACE TEMPORARY VIEW fleet_capacity_by_policy AS
WITH req AS (
    SELECT run_id,
           count(*) AS requests,
           sum(CASE WHEN outcome IN ({request_outcome.served},
                                     {request_outcome.deferred_then_served})
                    THEN 1 ELSE 0 END)
               AS served,
           sum(CASE WHEN deferrals > 0 THEN 1 ELSE 0 END) AS deferred,
           sum(CASE WHEN outcome = {request_outcome.refused} THEN 1 ELSE 0 END) AS refused
    FROM requests
    GROUP BY run_id
), adm AS (
    SELECT run_id,
           sum(CASE WHEN decision = {decision.admitted} AND NOT feasible THEN 1 ELSE 0 END)
               AS infeasible_admissions,
           max(protected_blocks) AS peak_protected_blocks
    FROM feasibility
    GROUP BY run_id
), cl AS (
    SELECT run_id,
           count(*) AS claims,
           sum(CASE WHEN outcome = {claim_outcome.harmed} THEN 1 ELSE 0 END) AS harmed
    FROM claims
    GROUP BY run_id
)
SELECT
    -- the run policy (manifest)
    m.policy,
    -- runs under it
    count(*) AS runs,
    -- the smallest and largest pool (usable blocks) among them
    min(m.usable_blocks) AS min_usable_blocks,
    max(m.usable_blocks) AS max_usable_blocks,
    -- requests seen, served (at once or after deferrals), deferred at least once, refused
    CAST(coalesce(sum(r.requests), 0) AS BIGINT) AS requests,
    CAST(coalesce(sum(r.served), 0) AS BIGINT) AS served,
    CAST(coalesce(sum(r.deferred), 0) AS BIGINT) AS deferred,
    CAST(coalesce(sum(r.refused), 0) AS BIGINT) AS refused,
    -- admissions where protected + required blocks exceeded the usable pool
    CAST(coalesce(sum(a.infeasible_admissions), 0) AS BIGINT) AS infeasible_admissions,
    -- the most blocks held protected at any admission decision, over its runs
    max(a.peak_protected_blocks) AS peak_protected_blocks,
    -- claims declared and, of those, harmed
    CAST(coalesce(sum(c.claims), 0) AS BIGINT) AS claims,
    CAST(coalesce(sum(c.harmed), 0) AS BIGINT) AS claims_harmed
FROM manifests m
LEFT JOIN req r ON r.run_id = m.run_id
LEFT JOIN adm a ON a.run_id = m.run_id
LEFT JOIN cl c ON c.run_id = m.run_id
GROUP BY m.policy;
