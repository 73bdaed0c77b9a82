-- Stage 5a: feasibility, rebuilt from the block timeline at every admission decision
-- (request_admitted / request_deferred / request_refused) and preemption
-- (docs/reconstruction.md, "Feasibility").
--
-- protected_blocks: distinct cached blocks bound (a current binding, position < k) to claim
--   instances in force whose mode promises residency (recorder.schema.RESIDENCY_MODES), from
--   the labelling pass's snapshot (kv_admission_state), whatever the runtime did with them.
--   NOTE: with scheduler steps, the snapshot is the pool as the decision's step found it
--   (vLLM allocates, and evicts, for a request before it records the decision).
-- required_blocks: the request's blocks not hit in the cache: its prompt's blocks,
--   ceil(num_prompt_tokens / block_size), less its block_hit events of that admission (the
--   decision itself if admitted, else the request's next admission; in the admission's
--   scheduler step when the trace has steps, else up to the request's next lifecycle event).
--   NOTE: not the step's allocations: chunked prefill allocates a long prompt over several
--   steps. Without the prompt's size in the trace: the admission's allocations; without
--   either, NULL (no hit is credited without evidence).
-- feasible: protected + required <= usable (docs/design.md, "Feasibility").
-- The runtime's own figures stay beside them (runtime_*); agrees: both verdicts are equal.

CREATE OR REPLACE TEMP TABLE kv_decisions AS
SELECT run_id, seq, ts_ns, step, event, request_id, protected_blocks, blocks_required,
       usable_blocks, free_blocks, shortfall_blocks, blocking_claim_ids
FROM events
WHERE event IN ('request_admitted', 'request_deferred', 'request_refused', 'request_preempted')
  AND request_id IS NOT NULL;

-- An admission's allocations. With steps: the request's block_allocated events in the
-- admission's step (one aggregate, no per-event join). Without: those up to the request's next
-- lifecycle event.
CREATE OR REPLACE TEMP TABLE kv_admission_allocs AS
WITH adm AS (
    SELECT run_id, request_id, seq AS adm_seq, step AS adm_step
    FROM kv_decisions WHERE event = 'request_admitted'
), per_step AS (
    SELECT run_id, request_id, step, count(*) FILTER (WHERE event = 'block_allocated') AS n,
           count(*) AS n_blocks
    FROM events
    WHERE event IN ('block_allocated', 'block_hit') AND step IS NOT NULL
      AND request_id IS NOT NULL
    GROUP BY ALL
), life AS (
    SELECT run_id, request_id, seq, event,
           lead(seq) OVER (PARTITION BY run_id, request_id ORDER BY seq) AS next_seq
    FROM (SELECT run_id, request_id, seq, event FROM kv_decisions WHERE step IS NULL
          UNION ALL
          SELECT run_id, request_id, seq, event FROM events
          WHERE event = 'request_finished' AND request_id IS NOT NULL AND step IS NULL)
), adm_stepless AS (
    SELECT run_id, request_id, seq AS adm_seq, next_seq AS adm_end
    FROM life WHERE event = 'request_admitted'
), alloc_stepless AS (
    SELECT x.run_id, x.request_id, x.seq, x.event, a.adm_seq, a.adm_end
    FROM (SELECT run_id, request_id, seq, event FROM events
          WHERE event IN ('block_allocated', 'block_hit') AND request_id IS NOT NULL
            AND step IS NULL) x
    ASOF JOIN adm_stepless a ON a.run_id = x.run_id AND a.request_id = x.request_id
                            AND x.seq > a.adm_seq
)
-- NOTE: an admission with neither an allocation nor a hit in the trace has no evidence of its
-- blocks: NULL here, so feasibility falls back to the prompt's blocks (never a guessed 0)
SELECT a.run_id, a.request_id, a.adm_seq, CASE WHEN c.n_blocks > 0 THEN c.n END AS allocated,
       coalesce(c.n_blocks - c.n, 0) AS hits
FROM adm a
LEFT JOIN per_step c
  ON c.run_id = a.run_id AND c.request_id = a.request_id AND c.step = a.adm_step
WHERE a.adm_step IS NOT NULL
UNION ALL
SELECT a.run_id, a.request_id, a.adm_seq,
       CASE WHEN count(x.seq) FILTER (WHERE a.adm_end IS NULL OR x.seq < a.adm_end) > 0
            THEN count(x.seq) FILTER (WHERE (a.adm_end IS NULL OR x.seq < a.adm_end)
                                        AND x.event = 'block_allocated') END AS allocated,
       count(x.seq) FILTER (WHERE (a.adm_end IS NULL OR x.seq < a.adm_end)
                              AND x.event = 'block_hit') AS hits
FROM adm_stepless a
LEFT JOIN alloc_stepless x
  ON x.run_id = a.run_id AND x.request_id = a.request_id AND x.adm_seq = a.adm_seq
GROUP BY a.run_id, a.request_id, a.adm_seq;

CREATE OR REPLACE TABLE feasibility AS
WITH prompt AS (
    SELECT e.run_id, e.request_id,
           arg_min(e.num_prompt_tokens, e.seq) AS num_prompt_tokens
    FROM events e WHERE e.event = 'request_arrived' AND e.request_id IS NOT NULL
    GROUP BY ALL
), bsize AS (
    SELECT run_id, arg_min(block_size, seq) AS block_size
    FROM events WHERE event = 'run_started' GROUP BY run_id
), later AS (
    SELECT d.run_id, d.seq, a.allocated, a.hits
    FROM (SELECT * FROM kv_decisions
          WHERE event IN ('request_deferred', 'request_preempted')) d
    ASOF JOIN kv_admission_allocs a
      ON a.run_id = d.run_id AND a.request_id = d.request_id AND a.adm_seq >= d.seq
), f AS (
    SELECT d.run_id, d.seq, d.ts_ns, d.step, d.request_id, d.event,
           coalesce(d.usable_blocks, r.usable_blocks) AS usable_blocks,
           s.protected_blocks,
           coalesce(
               greatest(0, ceil(p.num_prompt_tokens / NULLIF(b.block_size, 0))::BIGINT
                           - coalesce(a.hits, CASE WHEN a.adm_seq IS NULL THEN l.hits END, 0)),
               a.allocated, CASE WHEN a.adm_seq IS NULL THEN l.allocated END)
               AS required_blocks,
           d.protected_blocks AS runtime_protected_blocks,
           d.blocks_required AS runtime_required_blocks,
           s.protected_claim_seqs,
           -- compatibility columns (the runtime's arithmetic, as before)
           d.free_blocks, d.shortfall_blocks AS reported_shortfall_blocks,
           d.blocking_claim_ids, r.policy, r.enforcing
    FROM kv_decisions d
    JOIN kv_runs r ON r.run_id = d.run_id
    LEFT JOIN kv_admission_state s ON s.run_id = d.run_id AND s.seq = d.seq
    LEFT JOIN bsize b ON b.run_id = d.run_id
    LEFT JOIN prompt p ON p.run_id = d.run_id AND p.request_id = d.request_id
    -- the decision's own admission (equality), else the request's next one (deferrals)
    LEFT JOIN kv_admission_allocs a
      ON a.run_id = d.run_id AND a.request_id = d.request_id AND a.adm_seq = d.seq
    LEFT JOIN later l ON l.run_id = d.run_id AND l.seq = d.seq
)
SELECT run_id, seq, ts_ns, step, request_id, event, usable_blocks, protected_blocks,
       required_blocks,
       protected_blocks + required_blocks <= usable_blocks AS feasible,
       runtime_protected_blocks, runtime_required_blocks,
       runtime_protected_blocks + runtime_required_blocks <= usable_blocks AS runtime_feasible,
       (protected_blocks + required_blocks <= usable_blocks)
           = (runtime_protected_blocks + runtime_required_blocks <= usable_blocks) AS agrees,
       protected_claim_seqs,
       replace(event, 'request_', '') AS decision,
       runtime_required_blocks AS blocks_required,
       runtime_protected_blocks + runtime_required_blocks AS demand_blocks,
       greatest(0, runtime_protected_blocks + runtime_required_blocks - usable_blocks)
           AS shortfall_blocks,
       reported_shortfall_blocks, free_blocks, blocking_claim_ids, policy, enforcing
FROM f
ORDER BY run_id, seq;
