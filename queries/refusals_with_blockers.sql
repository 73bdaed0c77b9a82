-- refusals_with_blockers: every deferral and refusal with each claim it named as blocking.
-- One row per (admission decision, blocking claim); a decision that named no claim has one
-- row with NULL claim columns. The blocking claim's instance is the latest one submitted at
-- or before the decision. Needs `feasibility`, `requests` and `events`.
CREATE OR REPLACE VIEW refusals_with_blockers AS
WITH d AS (
    SELECT f.*, unnest(CASE WHEN array_length(coalesce(f.blocking_claim_ids, [])) = 0 THEN [NULL]
                            ELSE f.blocking_claim_ids END) AS blocking_claim_id
    FROM feasibility f
    WHERE f.decision IN ({decision.deferred}, {decision.refused})
), subs AS (
    SELECT run_id, claim_id, seq AS claim_seq, tenant, protection_mode
    FROM events WHERE event = {event.claim_submitted}
), pick AS (
    -- NOTE: the latest instance submitted at or before the decision, as an aggregate (portable
    -- SQL, no ASOF join: the view runs on Spark too)
    SELECT d.run_id, d.seq, d.blocking_claim_id, max(s.claim_seq) AS claim_seq
    FROM d JOIN subs s
      ON s.run_id = d.run_id AND s.claim_id = d.blocking_claim_id AND s.claim_seq <= d.seq
    GROUP BY d.run_id, d.seq, d.blocking_claim_id
)
SELECT
    -- the run
    d.run_id,
    -- seq of the decision
    d.seq,
    -- time (ns, the recorder's monotonic clock)
    d.ts_ns,
    -- time in UTC (NULL when the run has no wall-clock anchor)
    d.ts,
    -- deferred | refused
    d.decision,
    -- the request that was deferred or refused
    d.request_id,
    -- its tenant (NULL when the trace does not say)
    q.tenant AS request_tenant,
    -- blocks it needed, as the runtime reported them
    d.blocks_required,
    -- blocks it needed: its prompt's blocks less hits (rebuilt from the trace)
    d.required_blocks,
    -- blocks the other running requests held (rebuilt)
    d.live_blocks,
    -- blocks protected by claims in force at the decision (rebuilt)
    d.protected_blocks,
    -- usable blocks in the pool
    d.usable_blocks,
    -- protected + live + required - usable (rebuilt; 0 when it would have fit)
    d.shortfall_blocks,
    -- the shortfall the runtime reported
    d.runtime_shortfall_blocks,
    -- a claim the decision named as blocking (NULL: none named)
    d.blocking_claim_id,
    -- that claim's instance (seq of its claim_submitted)
    s.claim_seq AS blocking_claim_seq,
    -- that claim's tenant
    s.tenant AS blocking_tenant,
    -- that claim's declared protection mode
    s.protection_mode AS blocking_protection_mode,
    -- true when the blocking claim belongs to the request's own tenant
    s.tenant IS NOT DISTINCT FROM q.tenant AND s.tenant IS NOT NULL AS own_claim
FROM d
LEFT JOIN requests q ON q.run_id = d.run_id AND q.request_id = d.request_id
LEFT JOIN pick p
  ON p.run_id = d.run_id AND p.seq = d.seq AND p.blocking_claim_id = d.blocking_claim_id
LEFT JOIN subs s ON s.run_id = p.run_id AND s.claim_seq = p.claim_seq
ORDER BY d.run_id, d.seq, d.blocking_claim_id NULLS FIRST;
