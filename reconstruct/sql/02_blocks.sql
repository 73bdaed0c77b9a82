-- Stage 2: block content timeline and block losses.
-- A block holds content from a block_cached (or block_hit, which proves the content is there)
-- until the next event on the same block_id, or the next cache_reset of its run, whichever
-- comes first. Identity of content is block_hash; one hash may be held by several blocks.

-- Every cache_reset, with the seq of the next one (an epoch is the span between two resets).
CREATE OR REPLACE TEMP TABLE kv_resets AS
SELECT run_id, seq, ts_ns,
       lead(seq) OVER (PARTITION BY run_id ORDER BY seq) AS next_reset_seq
FROM events
WHERE event = 'cache_reset';

-- The events that change or prove what a block holds.
CREATE OR REPLACE TEMP TABLE kv_block_ev AS
SELECT run_id, seq, ts_ns, event, block_id, block_hash, cause, by_request_id
FROM events
WHERE event IN ('block_cached', 'block_hit', 'block_evicted');

-- epoch = seq of the latest reset at or before the event (NULL before the first reset).
-- NOTE: {{EPOCH}} is replaced by the ASOF join below when the trace has resets, else by
-- `NULL::BIGINT AS epoch` (an ASOF join over an empty side still sorts the big one).
CREATE OR REPLACE TEMP TABLE kv_block_steps AS
WITH e AS (
    SELECT b.*, {{EPOCH}}
)
SELECT
    e.*,
    lag(seq) OVER w AS prev_seq,
    lag(event) OVER w AS prev_event,
    lag(block_hash) OVER w AS prev_hash,
    lag(epoch) OVER w AS prev_epoch,
    lead(seq) OVER w AS next_seq,
    lead(event) OVER w AS next_event,
    lead(block_hash) OVER w AS next_hash
FROM e
WINDOW w AS (PARTITION BY run_id, block_id ORDER BY seq);

-- One row per copy of content held by a block: [start_seq, end_seq), end_seq NULL = still held.
CREATE OR REPLACE TEMP TABLE kv_copies AS
WITH c AS (
    SELECT s.run_id, s.block_id, s.block_hash, s.seq AS start_seq, s.next_seq,
           s.next_event, s.next_hash,
           -- the first reset after this copy started ends it
           CASE WHEN s.epoch IS NULL
                THEN (SELECT min(r.seq) FROM kv_resets r WHERE r.run_id = s.run_id)
                ELSE r2.next_reset_seq END AS reset_seq
    FROM kv_block_steps s
    LEFT JOIN kv_resets r2 ON r2.run_id = s.run_id AND r2.seq = s.epoch
    WHERE s.event IN ('block_cached', 'block_hit') AND s.block_hash IS NOT NULL
)
SELECT run_id, block_id, block_hash, start_seq,
       least(next_seq, reset_seq) AS end_seq,
       CASE
           WHEN reset_seq IS NOT NULL AND (next_seq IS NULL OR reset_seq < next_seq) THEN 'reset'
           WHEN next_event IS NULL THEN NULL
           WHEN next_event = 'block_evicted' THEN 'evicted'
           WHEN next_hash IS DISTINCT FROM block_hash THEN 'overwritten'
           ELSE 'continued'
       END AS end_kind
FROM c;

-- One row per block loss: every block_evicted, plus one synthetic row per block that held
-- content when a cache_reset happened (cause 'reset', the reset's seq and ts).
CREATE OR REPLACE TEMP TABLE kv_losses AS
SELECT
    run_id, seq, ts_ns, block_id,
    -- NOTE: an eviction may omit the hash: it is the content of the block's last
    -- block_cached/block_hit (DESIGN §3); an eviction of an already-evicted block stays NULL.
    coalesce(block_hash,
             CASE WHEN prev_event IN ('block_cached', 'block_hit') THEN prev_hash END)
        AS block_hash,
    cause, by_request_id,
    coalesce(prev_event IN ('block_cached', 'block_hit')
             AND prev_epoch IS NOT DISTINCT FROM epoch, false) AS was_resident,
    block_hash AS reported_hash,
    CASE WHEN prev_event IN ('block_cached', 'block_hit')
              AND prev_epoch IS NOT DISTINCT FROM epoch THEN prev_hash END AS held_hash,
    false AS synthetic
FROM kv_block_steps
WHERE event = 'block_evicted'
UNION ALL
SELECT c.run_id, c.end_seq AS seq, r.ts_ns, c.block_id, c.block_hash, 'reset' AS cause,
       NULL AS by_request_id, true AS was_resident, NULL AS reported_hash,
       c.block_hash AS held_hash, true AS synthetic
FROM kv_copies c
JOIN kv_resets r ON r.run_id = c.run_id AND r.seq = c.end_seq
WHERE c.end_kind = 'reset';
