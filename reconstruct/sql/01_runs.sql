-- Stage 1: one row per run with the facts every later stage needs.
-- Inputs: view `events` (loader schema, plain strings), table `kv_manifest`
-- (run_id, policy, usable_blocks, truncated, evidence) and table `kv_policies` (policy, enforce).

-- NOTE: two scans of `events`, each decoding only what it reads: seqs and the first event
-- (three columns, every row) and the run-level kinds' facts (their columns, filtered on
-- `event` in the scan). One scan with FILTER aggregates decodes every column it names for
-- every row, block events included: up to twice the CPU (benchmarks/stages.py).
CREATE OR REPLACE TEMP TABLE kv_ev_runs AS
WITH s AS (
    SELECT run_id, min(seq) AS first_seq, max(seq) AS last_seq,
           arg_min(event, seq) AS first_event, count(*) AS n_events
    FROM events
    GROUP BY run_id
), k AS (
    SELECT
        run_id,
        arg_min(policy, seq) FILTER (WHERE event = {event.run_started}) AS started_policy,
        arg_min(usable_blocks, seq) FILTER (WHERE event = {event.run_started}) AS started_usable,
        arg_min(block_size, seq) FILTER (WHERE event = {event.run_started}) AS block_size,
        arg_min(schema_version, seq) FILTER (WHERE event = {event.run_started}) AS schema_version,
        arg_min(runtime, seq) FILTER (WHERE event = {event.run_started}) AS started_runtime,
        arg_min(recorder_version, seq) FILTER (WHERE event = {event.run_started})
            AS started_recorder,
        -- fail-open marks: enforcement from the first hook failure on is unknown
        -- (docs/conformance.md)
        min(seq) FILTER (WHERE event = {event.hook_failed}) AS hook_failed_seq,
        arg_min(hook, seq) FILTER (WHERE event = {event.hook_failed}) AS hook_failed_hook,
        arg_min(error_type, seq) FILTER (WHERE event = {event.hook_failed}) AS hook_failed_error,
        count(*) FILTER (WHERE event = {event.hook_failed}) AS n_hook_failures,
        -- NOTE: a gap's hole starts at its first dropped seq, which precedes the gap event
        min(least(seq, first_seq)) FILTER (WHERE event = {event.recorder_gap}) AS gap_seq,
        count(*) FILTER (WHERE event = {event.recorder_gap}) AS n_gaps,
        count(*) FILTER (WHERE event = {event.run_finished}) > 0 AS finished,
        max(events_written) FILTER (WHERE event = {event.run_finished}) AS events_written,
        max(events_dropped) FILTER (WHERE event = {event.run_finished}) AS events_dropped
    FROM events
    WHERE event IN ({event.run_started}, {event.hook_failed}, {event.recorder_gap},
                    {event.run_finished})
    GROUP BY run_id
)
-- NOTE: a run without any of those kinds has no row in k: its counts are 0, not NULL
SELECT s.run_id, s.first_seq, s.last_seq, s.first_event, s.n_events,
       k.started_policy, k.started_usable, k.block_size, k.schema_version, k.started_runtime,
       k.started_recorder, k.hook_failed_seq, k.hook_failed_hook, k.hook_failed_error,
       coalesce(k.n_hook_failures, 0) AS n_hook_failures, k.gap_seq,
       coalesce(k.n_gaps, 0) AS n_gaps, coalesce(k.finished, false) AS finished,
       k.events_written, k.events_dropped
FROM s LEFT JOIN k ON k.run_id IS NOT DISTINCT FROM s.run_id;

-- The first seq missing without a recorder_gap, for each run whose seqs are not dense
-- (only such runs pay for the sort; the recorder writes dense seqs).
CREATE OR REPLACE TEMP TABLE kv_holes AS
SELECT run_id, min(prev + 1) AS hole_seq
FROM (
    SELECT run_id, seq, lag(seq) OVER (PARTITION BY run_id ORDER BY seq) AS prev
    FROM events
    WHERE run_id IN (SELECT run_id FROM kv_ev_runs WHERE n_events <> last_seq - first_seq + 1)
)
WHERE seq > prev + 1
GROUP BY run_id;

-- A gap inside a scheduler step: the dropped events may belong to the step of the last event
-- held before the gap, and may hold its repair (a block cached again before the step ended).
-- Every loss of that step is therefore unknown too: the hole starts at the step's first seq.
-- NOTE: only runs with a gap pay for this (the held events just before it).
CREATE OR REPLACE TEMP TABLE kv_gap_steps AS
WITH before_gap AS (
    SELECT e.run_id, arg_max_null(e.step, e.seq) AS step
    FROM events e JOIN kv_ev_runs r ON r.run_id = e.run_id
    WHERE r.gap_seq IS NOT NULL AND e.seq < r.gap_seq
    GROUP BY e.run_id
)
SELECT b.run_id, min(e.seq) AS step_first_seq
FROM before_gap b
JOIN events e ON e.run_id = b.run_id AND e.step = b.step
GROUP BY b.run_id;

CREATE OR REPLACE TEMP TABLE kv_runs AS
SELECT
    r.run_id, r.first_seq, r.first_event, r.last_seq, r.n_events, r.n_gaps, r.finished,
    r.events_written, r.events_dropped, r.gap_seq, h.hole_seq,
    r.block_size, r.schema_version, r.hook_failed_seq, r.hook_failed_hook, r.hook_failed_error,
    r.n_hook_failures,
    -- 'observed': the stock-vLLM listener (claims declared beside the engine, no in-engine
    -- requests or admissions); 'in_engine' otherwise (our recorder, imports, fixtures)
    CASE WHEN m.evidence = {evidence.observed} THEN {evidence.observed} ELSE {evidence.in_engine} END AS evidence,
    -- The format the run's lifecycle events come from (docs/design.md §5 "Lifecycle
    -- legitimacy"): 'prototype' for the paper prototype's telemetry (kvclaims import --from
    -- arbiter-jsonl: manifest source_format, or the importer's run_started), whose format
    -- records no ttl_s and no released_by; 'kvclaims' otherwise (our recorder, JSON Lines).
    CASE WHEN coalesce(m.source_format = 'arbiter-jsonl'
                       OR r.started_runtime = 'vllm-arbiter-prototype'
                       OR r.started_recorder LIKE 'arbiter-import-%', false) THEN {lifecycle_source.prototype}
         ELSE {lifecycle_source.kvclaims} END AS lifecycle_source,
    -- NOTE: released_by exists from schema 2 on (loader.COLUMN_SINCE); a run that states no
    -- schema version is read as the current one
    coalesce(r.schema_version, 2) >= 2
        AND NOT coalesce(m.source_format = 'arbiter-jsonl'
                         OR r.started_runtime = 'vllm-arbiter-prototype'
                         OR r.started_recorder LIKE 'arbiter-import-%', false)
        AS released_by_recorded,
    coalesce(r.started_policy, m.policy) AS policy,
    coalesce(r.started_usable, m.usable_blocks) AS usable_blocks,
    coalesce(m.truncated, false) AS truncated,
    coalesce(p.enforce, false) AS enforcing,
    -- NOTE: every run starts with run_started at seq 0 (recorder, listener, importers); a
    -- run whose head is missing may have lost the claims its losses depend on
    (r.first_seq > 0 OR r.first_event <> {event.run_started}) AS head_missing,
    -- Every loss at or after this seq is `unknown` (docs/design.md: never guess after a hole).
    least(r.gap_seq, g.step_first_seq, h.hole_seq,
          CASE WHEN r.first_seq > 0 OR r.first_event <> {event.run_started} THEN r.first_seq END)
        AS unknown_from_seq,
    -- Whether anything after the last event we hold could still change an outcome.
    (coalesce(m.truncated, false) OR r.gap_seq IS NOT NULL OR h.hole_seq IS NOT NULL
     OR r.first_seq > 0 OR r.first_event <> {event.run_started}) AS has_hole
FROM kv_ev_runs r
LEFT JOIN kv_manifest m USING (run_id)
LEFT JOIN kv_holes h USING (run_id)
LEFT JOIN kv_gap_steps g USING (run_id)
LEFT JOIN kv_policies p ON p.policy = coalesce(r.started_policy, m.policy);
