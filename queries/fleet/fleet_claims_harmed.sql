-- fleet_claims_harmed: claims harmed per tenant per UTC day, over every run of a fleet dataset.
-- One row per (day, tenant) with at least one harmed claim. The day is the UTC day of the
-- claim's first harm (from the run's wall-clock anchor); NULL for runs without a clock. One SQL
-- text for Spark SQL and DuckDB alike (docs/fleet.md). Needs `claims`.
CREATE OR REPLACE TEMPORARY VIEW fleet_claims_harmed AS
SELECT
    -- the UTC day of the first harm (NULL: the run has no wall-clock anchor)
    CAST(first_harm_ts AS DATE) AS day,
    -- the tenant that declared the claims
    tenant,
    -- claims whose outcome is harmed
    count(*) AS claims_harmed,
    -- runs those claims were harmed in
    count(DISTINCT run_id) AS runs,
    -- bound blocks those claims lost as harm
    CAST(sum(blocks_lost_harm) AS BIGINT) AS blocks_lost_harm
FROM claims
WHERE outcome = {claim_outcome.harmed}
GROUP BY CAST(first_harm_ts AS DATE), tenant;
