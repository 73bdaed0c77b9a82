-- claim_timeline: every lifecycle event and every block loss of a claim instance, in order.
-- One row per claim event (submitted, accepted, rejected, bound, materialized, demoted,
-- expired, released, release refused, harmed as reported by the runtime) and per loss of a
-- block bound to the claim (from `loss_claims`, with its label). A claim instance starts at
-- its `claim_submitted`; its acceptance or rejection belongs to it; every other event with that
-- claim_id belongs to the latest instance not rejected before it (a rejected submission, e.g.
-- another tenant reusing an id in force, never captures the owner's events; events before any
-- submit: from the id's first claim event). Needs `events` and `loss_claims`.
CREATE OR REPLACE VIEW claim_timeline AS
WITH raw AS (
    SELECT run_id, claim_id, seq, ts_ns, ts, event, position, request_id, tenant,
           protection_mode, released_by, reason, by_request_id,
           -- NOTE: the reconstruction's claim_seq rule, as windows (portable SQL, no ASOF)
           max(CASE WHEN event = {event.claim_submitted} THEN seq END) OVER (
               PARTITION BY run_id, claim_id ORDER BY seq
               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS sub_seq,
           min(seq) OVER (PARTITION BY run_id, claim_id) AS first_seq
    FROM events
    WHERE claim_id IS NOT NULL AND event LIKE 'claim_%'
), subs AS (
    SELECT run_id, claim_id, sub_seq,
           min(CASE WHEN event = {event.claim_rejected} THEN seq END) AS rejected_seq
    FROM raw WHERE sub_seq IS NOT NULL
    GROUP BY run_id, claim_id, sub_seq
), live AS (
    SELECT run_id, claim_id, sub_seq, rejected_seq,
           max(CASE WHEN rejected_seq IS NULL THEN sub_seq END) OVER (
               PARTITION BY run_id, claim_id ORDER BY sub_seq
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_live_seq
    FROM subs
), claim_events AS (
    SELECT e.run_id, e.claim_id, e.seq, e.ts_ns, e.ts, e.event, e.position, e.request_id,
           e.tenant, e.protection_mode, e.released_by, e.reason, e.by_request_id,
           CASE WHEN e.sub_seq IS NULL THEN e.first_seq
                WHEN e.event IN ({event.claim_submitted}, {event.claim_accepted}, {event.claim_rejected})
                    THEN e.sub_seq
                WHEN l.rejected_seq < e.seq AND l.prev_live_seq IS NOT NULL
                    THEN l.prev_live_seq
                ELSE e.sub_seq END AS claim_seq
    FROM raw e
    LEFT JOIN live l
      ON l.run_id = e.run_id AND l.claim_id = e.claim_id AND l.sub_seq = e.sub_seq
), rows AS (
    SELECT run_id, claim_id, claim_seq, seq, ts_ns, ts, 'event' AS kind, event AS what,
           CAST(NULL AS VARCHAR) AS label, CAST(NULL AS INTEGER) AS block_id, position,
           request_id, tenant, protection_mode, released_by, reason, by_request_id
    FROM claim_events
    UNION ALL
    SELECT run_id, claim_id, claim_seq, seq, ts_ns, ts, 'loss', 'block_lost', label, block_id,
           position, NULL, tenant, protection_mode, NULL, NULL, by_request_id
    FROM loss_claims
)
SELECT
    -- the run
    r.run_id,
    -- the claim's id as declared
    r.claim_id,
    -- the claim instance: seq of its claim_submitted (or of the id's first event)
    r.claim_seq,
    -- seq of this event or loss
    r.seq,
    -- time (ns, the recorder's monotonic clock)
    r.ts_ns,
    -- time in UTC (NULL when the run has no wall-clock anchor)
    r.ts,
    -- event | loss
    r.kind,
    -- the event name (claim_submitted, claim_accepted, ...), or block_lost
    r.what,
    -- for a loss: harm | unknown | expiry | relaxation | eviction (NULL for events)
    r.label,
    -- for a loss: the block that lost the content
    r.block_id,
    -- the position in the claim (claim_bound, and a loss's position)
    r.position,
    -- the request named by the event (submission, release)
    r.request_id,
    -- the tenant named by the event (submission, release) or owning the claim (loss)
    r.tenant,
    -- the protection mode (submission; a loss: the claim's effective mode)
    r.protection_mode,
    -- claim_released: tenant | operator | arbiter (NULL when the trace does not say)
    r.released_by,
    -- the runtime's reason (rejection, demotion, expiry, release)
    r.reason,
    -- the request whose allocation caused the loss or the demotion
    r.by_request_id
FROM rows r
ORDER BY r.run_id, r.claim_id, r.claim_seq, r.seq, r.kind DESC, r.block_id NULLS FIRST;
