-- Stage 5a: feasibility, rebuilt from the block timeline at every admission decision
-- (request_admitted / request_deferred / request_refused) and preemption
-- (docs/reconstruction.md, "Feasibility").
--
-- protected_blocks: distinct cached blocks bound (a current binding, position < k) to claim
--   instances in force whose mode promises residency (recorder.schema.RESIDENCY_MODES), from
--   the labelling pass's snapshot (kv_admission_state), whatever the runtime did with them.
-- required_blocks: the request's blocks not hit in the cache: its block_allocated events of
--   that admission (the decision itself if admitted, else the request's next admission; from
--   the admission to the request's next lifecycle event, in the admission's scheduler step
--   when the trace has steps). A request never admitted: its prompt's blocks,
--   ceil(num_prompt_tokens / block_size) (no hit can be credited without an admission).
-- feasible: protected + required <= usable (DESIGN: docs/design.md, "Feasibility").
-- The runtime's own figures stay beside them (runtime_*); agrees: both verdicts are equal.

CREATE OR REPLACE TEMP TABLE kv_decisions AS
SELECT run_id, seq, ts_ns, step, event, request_id, protected_blocks, blocks_required,
       usable_blocks, free_blocks, shortfall_blocks, blocking_claim_ids
FROM events
WHERE event IN ('request_admitted', 'request_deferred', 'request_refused', 'request_preempted')
  AND request_id IS NOT NULL;

CREATE OR REPLACE TEMP TABLE kv_admission_allocs AS
WITH life AS (
    SELECT run_id, request_id, seq, step, event,
           lead(seq) OVER (PARTITION BY run_id, request_id ORDER BY seq) AS next_seq
    FROM (SELECT run_id, request_id, seq, step, event FROM kv_decisions
          UNION ALL
          SELECT run_id, request_id, seq, step, event FROM events
          WHERE event = 'request_finished' AND request_id IS NOT NULL)
), adm AS (
    SELECT run_id, request_id, seq AS adm_seq, step AS adm_step, next_seq AS adm_end
    FROM life WHERE event = 'request_admitted'
), alloc AS (
    SELECT a.run_id, a.request_id, a.seq, a.step
    FROM events a
    WHERE a.event = 'block_allocated' AND a.request_id IS NOT NULL
)
SELECT d.run_id, d.request_id, d.adm_seq, d.adm_step,
       count(x.seq) FILTER (WHERE (d.adm_end IS NULL OR x.seq < d.adm_end)
                              AND (d.adm_step IS NULL OR x.step = d.adm_step)) AS allocated
FROM adm d
LEFT JOIN (SELECT x.*, a.adm_seq
           FROM alloc x
           ASOF JOIN adm a ON a.run_id = x.run_id AND a.request_id = x.request_id
                          AND x.seq > a.adm_seq) x
  ON x.run_id = d.run_id AND x.request_id = d.request_id AND x.adm_seq = d.adm_seq
GROUP BY ALL;

CREATE OR REPLACE TABLE feasibility AS
WITH prompt AS (
    SELECT e.run_id, e.request_id,
           arg_min(e.num_prompt_tokens, e.seq) AS num_prompt_tokens
    FROM events e WHERE e.event = 'request_arrived' AND e.request_id IS NOT NULL
    GROUP BY ALL
), bsize AS (
    SELECT run_id, arg_min(block_size, seq) AS block_size
    FROM events WHERE event = 'run_started' GROUP BY run_id
), f AS (
    SELECT d.run_id, d.seq, d.ts_ns, d.step, d.request_id, d.event,
           coalesce(d.usable_blocks, r.usable_blocks) AS usable_blocks,
           s.protected_blocks,
           coalesce(a.allocated,
                    CASE WHEN d.event <> 'request_preempted' AND b.block_size > 0
                         THEN ceil(p.num_prompt_tokens / b.block_size)::BIGINT END)
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
    ASOF LEFT JOIN kv_admission_allocs a
      ON a.run_id = d.run_id AND a.request_id = d.request_id AND a.adm_seq >= d.seq
     AND d.event <> 'request_refused'
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
