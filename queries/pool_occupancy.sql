-- pool_occupancy: how many blocks hold reusable (cached) content over time, per run.
-- One row per event that changes it (block_cached on a block not already holding that
-- content, or a loss). Needs `events` and the reconstructed table `losses`.
CREATE OR REPLACE VIEW pool_occupancy AS
WITH changes AS (
    SELECT run_id, seq, ts_ns, ts, 1 AS delta, {event.block_cached} AS change
    FROM (SELECT run_id, seq, ts_ns, ts, event, block_hash,
                 lag(event) OVER (PARTITION BY run_id, block_id ORDER BY seq) AS prev_event,
                 lag(block_hash) OVER (PARTITION BY run_id, block_id ORDER BY seq) AS prev_hash
          FROM events WHERE event IN ({event.block_cached}, {event.block_evicted}, {event.cache_reset}))
    WHERE event = {event.block_cached}
      AND NOT (prev_event = {event.block_cached} AND prev_hash IS NOT DISTINCT FROM block_hash)
    UNION ALL
    SELECT run_id, seq, ts_ns, ts, -1, 'loss:' || label FROM losses WHERE was_resident
)
SELECT
    -- the run
    run_id,
    -- seq of the change
    seq,
    -- time of the change (ns, the recorder's monotonic clock)
    ts_ns,
    -- time of the change in UTC (NULL when the run has no wall-clock anchor)
    ts,
    -- what changed: block_cached, or loss:<label>
    change,
    -- blocks holding cached content after this change
    sum(delta) OVER (PARTITION BY run_id ORDER BY seq, delta DESC
                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)::BIGINT AS cached_blocks
FROM changes
ORDER BY run_id, seq, delta DESC;
