-- fleet_findings_by_kind: findings per kind and severity over every run of a fleet dataset:
-- holes in the evidence, disagreements with the runtime, violations, anomalies. One row per
-- (kind, severity). One SQL text for Spark SQL and DuckDB alike (docs/fleet.md). Needs
-- `findings`.
CREATE OR REPLACE TEMPORARY VIEW fleet_findings_by_kind AS
SELECT
    -- what was found (docs/reconstruction.md, "Findings")
    kind,
    -- hole | disagreement | violation | security | anomaly
    severity,
    -- findings of that kind
    count(*) AS findings,
    -- runs with at least one
    count(DISTINCT run_id) AS runs
FROM findings
GROUP BY kind, severity;
