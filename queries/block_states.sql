-- block_states: how the usable pool splits, after every change, into blocks protected by claims,
-- held by requests, cached (reusable, evictable) and free, per run.
-- Categories are exclusive and taken in that order: protected (content bound to a claim in
-- force whose blocks are pinned: `claims.pinned_mode`), held (referenced by a request), cached
-- (content, unreferenced), free (the rest of the run's usable blocks); free + cached is vLLM's
-- free queue. Needs `events` and the reconstructed tables `losses` and `claims`.
CREATE OR REPLACE VIEW block_states AS
WITH be AS (
    SELECT run_id, seq, ts_ns, block_id,
           CASE event WHEN {event.block_freed} THEN -1 WHEN {event.block_cached} THEN 0
                WHEN {event.block_evicted} THEN 0 ELSE 1 END AS dref,
           event IN ({event.block_cached}, {event.block_hit}, {event.block_evicted}) AS cset,
           CASE WHEN event IN ({event.block_cached}, {event.block_hit}) THEN block_hash END AS h
    FROM events
    WHERE event IN ({event.block_allocated}, {event.block_hit}, {event.block_freed},
                    {event.block_cached}, {event.block_evicted}) AND block_id IS NOT NULL
    UNION ALL  -- a cache reset empties every block holding content (synthetic loss rows)
    SELECT run_id, seq, ts_ns, block_id, 0, true, NULL FROM losses WHERE synthetic
), content AS (  -- each block's content intervals [c_from, c_to)
    SELECT run_id, block_id, seq AS c_from, h,
           coalesce(lead(seq) OVER (PARTITION BY run_id, block_id ORDER BY seq),
                    9223372036854775807) AS c_to
    FROM be WHERE cset
), bind AS (  -- per claim instance: the latest claims row with claim_seq <= the binding
    SELECT b.run_id, c.claim_seq, b.block_hash AS h, b.seq AS b_from,
           coalesce(lead(b.seq) OVER (PARTITION BY b.run_id, c.claim_seq, b.position
                                      ORDER BY b.seq), 9223372036854775807) AS b_to
    FROM (SELECT * FROM events WHERE event = {event.claim_bound}) b
    ASOF JOIN (SELECT run_id, claim_id, claim_seq FROM claims) c
      ON c.run_id = b.run_id AND c.claim_id = b.claim_id AND b.seq >= c.claim_seq
), force AS (
    SELECT run_id, claim_seq, accepted_seq AS f_from,
           coalesce(release_seq, 9223372036854775807) AS f_to
    FROM claims WHERE pinned_mode AND accepted_seq IS NOT NULL
), prot AS (  -- content hashes protected, per claim binding in force
    SELECT b.run_id, b.h, greatest(b.b_from, f.f_from) AS p_from, least(b.b_to, f.f_to) AS p_to
    FROM bind b JOIN force f ON f.run_id = b.run_id AND f.claim_seq = b.claim_seq
    WHERE greatest(b.b_from, f.f_from) < least(b.b_to, f.f_to)
), overlap AS (  -- a block is protected while its content overlaps a protected interval
    SELECT c.run_id, c.block_id, greatest(c.c_from, p.p_from) AS o_from,
           least(c.c_to, p.p_to) AS o_to
    FROM content c JOIN prot p ON p.run_id = c.run_id AND p.h = c.h
    WHERE greatest(c.c_from, p.p_from) < least(c.c_to, p.p_to)
), pts AS (  -- every change point of every block
    SELECT run_id, block_id, seq, max(ts_ns) AS ts_ns, sum(dref) AS dref, sum(dp) AS dp,
           max(CASE WHEN cset THEN (h IS NOT NULL)::INT END) AS has
    FROM (SELECT run_id, block_id, seq, ts_ns, dref, 0 AS dp, cset, h FROM be
          UNION ALL SELECT run_id, block_id, o_from, NULL, 0, 1, false, NULL FROM overlap
          UNION ALL SELECT run_id, block_id, o_to, NULL, 0, -1, false, NULL FROM overlap
                    WHERE o_to < 9223372036854775807)
    GROUP BY ALL
), cat AS (
    SELECT run_id, block_id, seq, ts_ns,
           CASE WHEN has_content AND prot > 0 THEN 1  -- protected
                WHEN refs > 0 THEN 2                  -- held
                WHEN has_content THEN 3               -- cached
                ELSE 0 END AS cat                     -- free
    FROM (SELECT run_id, block_id, seq, ts_ns,
                 sum(dref) OVER w AS refs, sum(dp) OVER w AS prot,
                 coalesce(last_value(has IGNORE NULLS) OVER w, 0) = 1 AS has_content
          FROM pts WINDOW w AS (PARTITION BY run_id, block_id ORDER BY seq
                                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
), moves AS (
    SELECT run_id, seq, ts_ns, cat,
           lag(cat, 1, 0) OVER (PARTITION BY run_id, block_id ORDER BY seq) AS prev
    FROM cat
), steps AS (
    SELECT run_id, seq, max(ts_ns) AS ts_ns,
           sum((cat = 1)::INT - (prev = 1)::INT) AS d_protected,
           sum((cat = 2)::INT - (prev = 2)::INT) AS d_held,
           sum((cat = 3)::INT - (prev = 3)::INT) AS d_cached
    FROM moves WHERE cat <> prev GROUP BY ALL
), usable AS (
    SELECT run_id, arg_min(usable_blocks, seq) AS usable_blocks
    FROM events WHERE event = {event.run_started} GROUP BY run_id
), totals AS (
    SELECT run_id, seq, ts_ns,
           sum(d_protected) OVER w AS protected,
           sum(d_held) OVER w AS held,
           sum(d_cached) OVER w AS cached
    FROM steps
    WINDOW w AS (PARTITION BY run_id ORDER BY seq
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT
    -- the run
    t.run_id,
    -- seq of the change
    t.seq,
    -- time of the change (ns, the recorder's monotonic clock)
    t.ts_ns,
    -- blocks of content bound to a pinned claim in force (held or not)
    t.protected::BIGINT AS protected,
    -- blocks referenced by a running request (not protected)
    t.held::BIGINT AS held,
    -- blocks holding reusable content, referenced by no request (evictable)
    t.cached::BIGINT AS cached,
    -- the rest of the run's usable blocks (NULL when run_started does not say)
    (u.usable_blocks - t.protected - t.held - t.cached)::BIGINT AS free,
    -- the run's usable blocks
    u.usable_blocks
FROM totals t
LEFT JOIN usable u ON u.run_id = t.run_id
ORDER BY t.run_id, t.seq;
