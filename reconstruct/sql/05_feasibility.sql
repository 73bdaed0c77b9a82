-- Stage 5a: feasibility, rebuilt from the block timeline at every admission decision
-- (request_admitted / request_deferred / request_refused) and preemption
-- (docs/reconstruction.md, "Feasibility"; seed 000's inequality
-- protected_resident_kv + active_live_kv <= usable_kv).
--
-- protected_blocks: distinct cached blocks bound (a current binding, position < k) to claim
--   instances in force whose mode promises residency (kvclaims.contract.schema.RESIDENCY_MODES), from
--   the labelling pass's snapshot (kv_admission_state), whatever the runtime did with them.
--   NOTE: with scheduler steps, the snapshot is the pool as the request found it: before its
--   own run of block events in the decision's step (vLLM allocates, hits and evicts for a
--   request right before it records the decision); the requests scheduled before it in the
--   same step are in. Without steps, or without own block events before it: at its seq.
-- live_blocks: the blocks the running requests hold in that snapshot (referenced by a
--   request), less the protected ones (never counted twice); the request's own blocks are not
--   in it (its own need is required_blocks).
-- required_blocks: the request's own need: its prompt's blocks,
--   ceil(num_prompt_tokens / block_size), less its hits on protected content at that admission
--   (the decision itself if admitted, else the request's next admission; in the admission's
--   scheduler step when the trace has steps, else up to the request's next lifecycle event):
--   those blocks are counted in protected_blocks; a hit on an unprotected cached block takes
--   that block as this request's live KV, so it stays in the need.
--   NOTE: not the step's allocations: chunked prefill allocates a long prompt over several
--   steps, and chunking does not bound live KV. With steps, what the admission's step took
--   (allocations + hits) when that is more: a request resumed after a preemption recomputes
--   its prompt and the output so far. Without the prompt's size in the trace: the
--   admission's allocations; without either, NULL (no hit is credited without evidence).
--   A preemption needs nothing new: the preempted request's blocks are among live_blocks (0).
-- active_live_blocks = live_blocks + required_blocks;
-- feasible: protected + active_live <= usable (docs/design.md, "Feasibility");
-- shortfall_blocks: protected + active_live - usable, at least 0 (rebuilt).
-- The runtime's own figures stay beside them (runtime_*); agrees: both verdicts are equal.
-- NOTE: the runtime (recorder/arbiter.py) counts protected + its own required only; a
-- difference in any figure is a finding (07_findings.sql), never copied into the rebuilt one.

-- NOTE: `kv_stage_events`, the events stages 05-08 read besides the block timeline (request
-- decisions and lifecycle, claim lifecycle and runtime reports after submission, resets, gaps
-- and hook failures, with the columns those stages read: identity.STAGE_EVENTS and
-- STAGE_COLUMNS), is written in stage 02 by reconstruct/identity.py's pass over each run's
-- events, which reads those columns for the claim events anyway: no scan of `events` here.

-- A request's block events, one row per (request, scheduler step), or per event when the
-- trace has no steps (the stepless admission join below needs each one's seq):
-- n_allocated / n_cached / n_hit: its block_allocated / block_cached / block_hit events;
-- n_hit_after_admission: its hits after its last admission (the admission that served it).
-- NOTE: the one scan of the block events in stages 05-07 (06_outcomes reads it too).
CREATE OR REPLACE TEMP TABLE kv_request_blocks AS
WITH last_adm AS (
    SELECT run_id, request_id, max(seq) AS last_admitted_seq
    FROM kv_stage_events
    WHERE event = {event.request_admitted} AND request_id IS NOT NULL
    GROUP BY run_id, request_id
), b AS (
    SELECT e.run_id, e.request_id, e.step, CASE WHEN e.step IS NULL THEN e.seq END AS seq,
           e.event, e.seq > coalesce(a.last_admitted_seq, -1) AS after_admission,
           ph.seq IS NOT NULL AS protected_hit
    FROM events e
    LEFT JOIN last_adm a ON a.run_id = e.run_id AND a.request_id = e.request_id
    -- the pass's hits on content an in-force residency claim binds (equality join)
    LEFT JOIN kv_protected_hits ph ON ph.run_id = e.run_id AND ph.seq = e.seq
    WHERE e.event IN ({event.block_allocated}, {event.block_cached}, {event.block_hit})
      AND e.request_id IS NOT NULL
)
SELECT run_id, request_id, step, seq,
       count(*) FILTER (WHERE event = {event.block_allocated}) AS n_allocated,
       count(*) FILTER (WHERE event = {event.block_cached}) AS n_cached,
       count(*) FILTER (WHERE event = {event.block_hit}) AS n_hit,
       count(*) FILTER (WHERE event = {event.block_hit} AND protected_hit) AS n_prot_hit,
       count(*) FILTER (WHERE event = {event.block_hit} AND after_admission) AS n_hit_after_admission
FROM b
GROUP BY run_id, request_id, step, seq;

CREATE OR REPLACE TEMP TABLE kv_decisions AS
SELECT run_id, seq, ts_ns, step, event, request_id, protected_blocks, blocks_required,
       usable_blocks, free_blocks, shortfall_blocks, blocking_claim_ids
FROM kv_stage_events
WHERE event IN ({event.request_admitted}, {event.request_deferred}, {event.request_refused}, {event.request_preempted})
  AND request_id IS NOT NULL;

-- An admission's allocations. With steps: the request's block_allocated events in the
-- admission's step (one aggregate, no per-event join). Without: those up to the request's next
-- lifecycle event.
CREATE OR REPLACE TEMP TABLE kv_admission_allocs AS
WITH adm AS (
    SELECT run_id, request_id, seq AS adm_seq, step AS adm_step
    FROM kv_decisions WHERE event = {event.request_admitted}
), per_step AS (
    SELECT run_id, request_id, step, n_allocated AS n, n_allocated + n_hit AS n_blocks,
           n_prot_hit
    FROM kv_request_blocks
    WHERE step IS NOT NULL
), life AS (
    SELECT run_id, request_id, seq, event,
           lead(seq) OVER (PARTITION BY run_id, request_id ORDER BY seq) AS next_seq
    FROM (SELECT run_id, request_id, seq, event FROM kv_decisions WHERE step IS NULL
          UNION ALL
          SELECT run_id, request_id, seq, event FROM kv_stage_events
          WHERE event = {event.request_finished} AND request_id IS NOT NULL AND step IS NULL)
), adm_stepless AS (
    SELECT run_id, request_id, seq AS adm_seq, next_seq AS adm_end
    FROM life WHERE event = {event.request_admitted}
), alloc_stepless AS (
    -- each stepless allocation or hit, with the request's latest stepless admission before it
    -- NOTE: admissions' seqs grow with seq, so the running max is the latest one
    SELECT run_id, request_id, seq, n_allocated, n_hit, n_prot_hit,
           max(adm_seq) OVER (PARTITION BY run_id, request_id ORDER BY seq
                              ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS adm_seq
    FROM (SELECT run_id, request_id, seq, n_allocated, n_hit, n_prot_hit,
                 NULL::BIGINT AS adm_seq
          FROM kv_request_blocks
          WHERE step IS NULL AND n_allocated + n_hit > 0
          UNION ALL
          SELECT run_id, request_id, adm_seq, 0, 0, 0, adm_seq FROM adm_stepless)
)
-- NOTE: an admission with neither an allocation nor a hit in the trace has no evidence of its
-- blocks: NULL here, so feasibility falls back to the prompt's blocks (never a guessed 0)
SELECT a.run_id, a.request_id, a.adm_seq, CASE WHEN c.n_blocks > 0 THEN c.n END AS allocated,
       coalesce(c.n_blocks - c.n, 0) AS hits, coalesce(c.n_prot_hit, 0) AS prot_hits
FROM adm a
LEFT JOIN per_step c
  ON c.run_id = a.run_id AND c.request_id = a.request_id AND c.step = a.adm_step
WHERE a.adm_step IS NOT NULL
UNION ALL
SELECT a.run_id, a.request_id, a.adm_seq,
       CASE WHEN sum(x.n_allocated + x.n_hit) FILTER (WHERE a.adm_end IS NULL
                                                        OR x.seq < a.adm_end) > 0
            THEN sum(x.n_allocated) FILTER (WHERE a.adm_end IS NULL
                                              OR x.seq < a.adm_end)::BIGINT END AS allocated,
       coalesce(sum(x.n_hit) FILTER (WHERE a.adm_end IS NULL OR x.seq < a.adm_end),
                0)::BIGINT AS hits,
       coalesce(sum(x.n_prot_hit) FILTER (WHERE a.adm_end IS NULL OR x.seq < a.adm_end),
                0)::BIGINT AS prot_hits
FROM adm_stepless a
LEFT JOIN alloc_stepless x
  ON x.run_id = a.run_id AND x.request_id = a.request_id AND x.adm_seq = a.adm_seq
     AND x.seq > a.adm_seq
GROUP BY a.run_id, a.request_id, a.adm_seq;

-- The decisions with their rebuilt and reported figures, in no order (kv_feasibility_rows);
-- then feasibility, the same rows sorted.
-- NOTE: two statements: sorting the rows in the statement that joins them held the joins'
-- hash tables (the pass's snapshot carries a list of protecting claims per decision) and the
-- sort's rows at once, and ran out of memory_limit at 1 B events (at 100 M under 400MB).
-- Sorted on their own, the rows spill.
CREATE OR REPLACE TEMP TABLE kv_feasibility_rows AS
WITH prompt AS (
    SELECT e.run_id, e.request_id,
           arg_min(e.num_prompt_tokens, e.seq) AS num_prompt_tokens
    FROM kv_stage_events e WHERE e.event = {event.request_arrived} AND e.request_id IS NOT NULL
    GROUP BY ALL
), next_adm AS (
    -- each deferral with the request's next admission (at or after it)
    SELECT run_id, seq, request_id, event,
           min(CASE WHEN event = {event.request_admitted} THEN seq END) OVER (
               PARTITION BY run_id, request_id ORDER BY seq
               ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS next_adm_seq
    FROM kv_decisions
), later AS (
    SELECT d.run_id, d.seq, a.allocated, a.hits, a.prot_hits
    FROM next_adm d
    JOIN kv_admission_allocs a
      ON a.run_id = d.run_id AND a.request_id = d.request_id AND a.adm_seq = d.next_adm_seq
    WHERE d.event = {event.request_deferred}
), f AS (
    SELECT d.run_id, d.seq, d.ts_ns, d.step, d.request_id, d.event,
           coalesce(d.usable_blocks, r.usable_blocks) AS usable_blocks,
           s.protected_blocks,
           -- NOTE: the pass's snapshot precedes the request's own block events (see above):
           -- its own blocks are its need, never counted as another request's live KV
           s.live_blocks,
           -- NOTE: less only the hits on protected content (counted in protected_blocks): a
           -- hit on an unprotected cached block makes that block this request's live KV
           -- NOTE: with steps, an admission's own step shows what it took: more than its prompt
           -- when it resumes after a preemption (vLLM recomputes prompt and output so far)
           -- NOTE: DuckDB's greatest skips NULLs: the NULL tests keep a missing figure NULL
           CASE WHEN d.event = {event.request_preempted} THEN 0 ELSE coalesce(
               CASE WHEN p.num_prompt_tokens IS NOT NULL AND r.block_size > 0 THEN
               greatest(0, greatest(ceil(p.num_prompt_tokens / r.block_size)::BIGINT,
                                    CASE WHEN d.step IS NOT NULL
                                         THEN coalesce(a.allocated, 0) + a.hits END)
                           - coalesce(a.prot_hits,
                                      CASE WHEN a.adm_seq IS NULL THEN l.prot_hits END, 0))
               END,
               a.allocated + a.hits - a.prot_hits,
               CASE WHEN a.adm_seq IS NULL THEN l.allocated + l.hits - l.prot_hits END) END
               AS required_blocks,
           d.protected_blocks AS runtime_protected_blocks,
           d.blocks_required AS runtime_required_blocks,
           d.shortfall_blocks AS runtime_shortfall_blocks,
           s.protected_claim_seqs,
           -- the claim ids of the instances protecting blocks (the rebuilt blockers), distinct
           -- and sorted by the pass
           coalesce(s.protected_claim_ids, []::VARCHAR[]) AS protected_claim_ids,
           d.free_blocks, d.blocking_claim_ids, r.policy, r.enforcing
    FROM kv_decisions d
    JOIN kv_runs r ON r.run_id = d.run_id
    LEFT JOIN kv_admission_state s ON s.run_id = d.run_id AND s.seq = d.seq
    LEFT JOIN prompt p ON p.run_id = d.run_id AND p.request_id = d.request_id
    -- the decision's own admission (equality), else the request's next one (deferrals)
    LEFT JOIN kv_admission_allocs a
      ON a.run_id = d.run_id AND a.request_id = d.request_id AND a.adm_seq = d.seq
    LEFT JOIN later l ON l.run_id = d.run_id AND l.seq = d.seq
), g AS (
    SELECT f.*, live_blocks + required_blocks AS active_live_blocks,
           protected_blocks + live_blocks + required_blocks AS demand_blocks,
           runtime_protected_blocks + runtime_required_blocks <= usable_blocks
               AS runtime_feasible
    FROM f
)
SELECT run_id, seq, ts_ns, step, request_id, event, replace(event, 'request_', '') AS decision,
       usable_blocks,
       -- rebuilt from the block timeline
       protected_blocks, live_blocks, required_blocks, active_live_blocks, demand_blocks,
       demand_blocks <= usable_blocks AS feasible,
       CASE WHEN demand_blocks IS NOT NULL AND usable_blocks IS NOT NULL
            THEN greatest(0, demand_blocks - usable_blocks) END AS shortfall_blocks,
       protected_claim_seqs, protected_claim_ids,
       -- what the runtime reported at the decision
       runtime_protected_blocks, runtime_required_blocks, runtime_shortfall_blocks,
       runtime_feasible, blocking_claim_ids, free_blocks,
       (demand_blocks <= usable_blocks) = runtime_feasible AS agrees,
       -- compatibility names for the runtime's figures
       runtime_required_blocks AS blocks_required,
       runtime_shortfall_blocks AS reported_shortfall_blocks,
       policy, enforcing
FROM g;

CREATE OR REPLACE TABLE feasibility AS
SELECT * FROM kv_feasibility_rows ORDER BY run_id, seq;

DROP TABLE kv_feasibility_rows;
