-- claim_timeline: every lifecycle event and every block loss of a claim instance, in order.
-- One row per claim event (submitted, accepted, rejected, bound, materialized, demoted,
-- expired, released, release refused, harmed as reported by the runtime) and per loss of a
-- block bound to the claim (from `loss_claims`, with its label). A claim instance starts at
-- its `claim_submitted`; later events with that claim_id belong to the latest instance (events
-- before any submit: from the id's first claim event). Needs `events` and `loss_claims`.
CREATE OR REPLACE VIEW claim_timeline AS
WITH starts AS (
    -- NOTE: the same rule as the reconstruction's claim_seq: a submit starts an instance;
    -- events of an id before any submit belong to the id's first claim event
    SELECT run_id, claim_id, seq AS claim_seq
    FROM events WHERE event = 'claim_submitted' AND claim_id IS NOT NULL
    UNION
    SELECT run_id, claim_id, min(seq)
    FROM events WHERE claim_id IS NOT NULL AND event LIKE 'claim_%'
    GROUP BY run_id, claim_id
), rows AS (
    SELECT run_id, claim_id, seq, ts_ns, ts, 'event' AS kind, event AS what, NULL AS label,
           NULL::INTEGER AS block_id, position, request_id, tenant, protection_mode,
           released_by, reason, by_request_id
    FROM events
    WHERE claim_id IS NOT NULL AND event LIKE 'claim_%'
    UNION ALL
    SELECT run_id, claim_id, seq, ts_ns, ts, 'loss', 'block_lost', label, block_id, position,
           NULL, tenant, protection_mode, NULL, NULL, by_request_id
    FROM loss_claims
)
SELECT
    -- the run
    r.run_id,
    -- the claim's id as declared
    r.claim_id,
    -- the claim instance: seq of its claim_submitted (or of the id's first event)
    s.claim_seq,
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
ASOF JOIN starts s ON s.run_id = r.run_id AND s.claim_id = r.claim_id AND r.seq >= s.claim_seq
ORDER BY r.run_id, r.claim_id, s.claim_seq, r.seq, r.kind DESC, r.block_id NULLS FIRST;
