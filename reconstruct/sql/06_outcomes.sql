-- Stage 5: final outcome per claim instance and per request (docs/design.md "Labels",
-- docs/reconstruction.md "Tables"). Claims are instances: (run_id, claim_seq) is the key.

-- Every event that names a claim id (a release, a refused release, a runtime report, a refusal's
-- or preemption's blocking claims), mapped to the
-- claim instance in force for that id at its seq (the latest instance submitted at or before
-- it). NOTE: an id named before any instance of it exists maps to its next instance (a
-- request_arrived names the claim its request is about to submit).
CREATE OR REPLACE TEMP TABLE kv_claim_refs AS
WITH refs AS (
    SELECT run_id, seq, event, unnest(blocking_claim_ids) AS claim_id, request_id, NULL AS tenant,
           NULL AS released_by, NULL AS reason, NULL::UBIGINT AS block_hash
    FROM kv_stage_events
    WHERE event IN ({event.request_deferred}, {event.request_refused}, {event.request_preempted})
      AND blocking_claim_ids IS NOT NULL
), merged AS (
    -- the references and the instances of each claim id, in seq order (instance rows carry
    -- inst_seq); the running max is the latest instance so far, the min over the rest the next
    -- NOTE: an instance's seq is its claim_seq, and claim_seqs grow with seq; a rejected
    -- instance is never the one a reference names (stage 02: claim identity)
    SELECT run_id, seq, event, claim_id, request_id, tenant, released_by, reason, block_hash,
           is_ref,
           max(inst_seq) OVER (PARTITION BY run_id, claim_id ORDER BY seq, is_ref
                               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS latest_seq,
           max(any_seq) OVER (PARTITION BY run_id, claim_id ORDER BY seq, is_ref
                              ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS latest_any,
           min(any_seq) OVER (PARTITION BY run_id, claim_id ORDER BY seq, is_ref
                              ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS next_seq
    FROM (SELECT *, true AS is_ref, NULL::BIGINT AS inst_seq, NULL::BIGINT AS any_seq FROM refs
          UNION ALL
          SELECT run_id, claim_seq, NULL, claim_id, NULL, NULL, NULL, NULL, NULL, false,
                 CASE WHEN rejected_seq IS NULL OR accepted_seq IS NOT NULL THEN claim_seq END,
                 claim_seq
          FROM kv_claim_inst)
)
-- Every claim event that names a claim (a release, a refused release, a runtime report) keeps
-- the instance stage 02 gave it.
SELECT run_id, seq, event, claim_id, request_id, tenant, released_by, reason, block_hash,
       claim_seq
FROM kv_claim_ev
WHERE event IN ({event.claim_released}, {event.claim_release_refused}, {event.claim_materialized},
                {event.claim_harmed})
UNION ALL
SELECT run_id, seq, event, claim_id, request_id, tenant, released_by, reason, block_hash,
       coalesce(latest_seq, latest_any, next_seq) AS claim_seq
FROM merged
WHERE is_ref;

CREATE OR REPLACE TABLE claims AS
WITH lost AS (
    SELECT run_id, claim_seq,
           count(*) FILTER (WHERE label = {label.harm}) AS blocks_lost_harm,
           count(*) FILTER (WHERE label = {label.expiry}) AS blocks_lost_expiry,
           count(*) FILTER (WHERE label = {label.relaxation}) AS blocks_lost_relaxation,
           count(*) FILTER (WHERE label = {label.eviction}) AS blocks_lost_eviction,
           count(*) FILTER (WHERE label = {label.unknown}) AS blocks_lost_unknown,
           min(seq) FILTER (WHERE label = {label.harm}) AS first_harm_seq,
           arg_min(ts_ns, seq) FILTER (WHERE label = {label.harm}) AS first_harm_ts_ns,
           arg_min(by_request_id, seq) FILTER (WHERE label = {label.harm}) AS first_harm_by_request_id
    FROM loss_claims
    GROUP BY run_id, claim_seq
), rel AS (
    -- who released the instance, and how many releases by others were refused (issue 8
    -- item 8: a release takes the claim's own tenant; the operator's is recorded as such)
    SELECT run_id, claim_seq,
           arg_min(released_by, seq) FILTER (WHERE event = {event.claim_released}) AS released_by,
           count(*) FILTER (WHERE event = {event.claim_release_refused}) AS release_refusals,
           list(seq ORDER BY seq) FILTER (WHERE event = {event.claim_release_refused})
               AS release_refused_seqs
    FROM kv_claim_refs
    WHERE event IN ({event.claim_released}, {event.claim_release_refused})
    GROUP BY run_id, claim_seq
), o AS (
    SELECT
        f.run_id, f.claim_id, f.claim_seq, f.tenant, f.request_id, f.protection_mode,
        f.pinned_mode, f.k AS threshold_blocks, f.ttl_s, f.value, f.positions_bound,
        f.submitted_seq, f.accepted_seq, f.rejected_seq, f.reject_reason,
        m.materialized_seq, f.reported_materialized_seq,
        f.release_seq, f.release_event, f.reported_harm_seq,
        CASE f.release_event
            WHEN {event.claim_released} THEN f.release_released_by
            -- demotion and expiry are the arbiter's own (kvclaims/contract/schema.py RELEASERS)
            WHEN {event.claim_demoted} THEN {releaser.arbiter}
            WHEN {event.claim_expired} THEN {releaser.arbiter}
        END AS released_by,
        coalesce(rel.release_refusals, 0) AS release_refusals,
        coalesce(rel.release_refused_seqs, []::BIGINT[]) AS release_refused_seqs,
        coalesce(l.blocks_lost_harm, 0) AS blocks_lost_harm,
        coalesce(l.blocks_lost_expiry, 0) AS blocks_lost_expiry,
        coalesce(l.blocks_lost_relaxation, 0) AS blocks_lost_relaxation,
        coalesce(l.blocks_lost_eviction, 0) AS blocks_lost_eviction,
        coalesce(l.blocks_lost_unknown, 0) AS blocks_lost_unknown,
        l.first_harm_seq, l.first_harm_ts_ns, l.first_harm_by_request_id,
        CASE
            WHEN f.submitted_seq IS NULL THEN {claim_outcome.unknown}
            WHEN f.accepted_seq IS NULL AND f.rejected_seq IS NOT NULL THEN {claim_outcome.rejected}
            WHEN f.accepted_seq IS NULL THEN {claim_outcome.unknown}         -- submitted, never decided
            WHEN l.first_harm_seq IS NOT NULL THEN {claim_outcome.harmed}    -- final: harm is never undone
            WHEN coalesce(l.blocks_lost_unknown, 0) > 0 THEN {claim_outcome.unknown}
            -- a release is final; one before any hole is known
            WHEN f.release_seq IS NOT NULL AND f.release_seq < coalesce(r.unknown_from_seq, f.release_seq + 1)
                THEN CASE f.release_event WHEN {event.claim_demoted} THEN {claim_outcome.demoted}
                                          WHEN {event.claim_expired} THEN {claim_outcome.expired}
                                          ELSE {claim_outcome.released} END
            -- anything else could still change behind a gap or after a truncation
            WHEN r.has_hole THEN {claim_outcome.unknown}
            WHEN m.materialized_seq IS NOT NULL THEN {claim_outcome.preserved}
            ELSE {claim_outcome.never_materialized}
        END AS outcome
    FROM kv_claim_facts f
    JOIN kv_runs r ON r.run_id = f.run_id
    LEFT JOIN kv_materialized m ON m.run_id = f.run_id AND m.claim_seq = f.claim_seq
    LEFT JOIN lost l ON l.run_id = f.run_id AND l.claim_seq = f.claim_seq
    LEFT JOIN rel ON rel.run_id = f.run_id AND rel.claim_seq = f.claim_seq
)
SELECT
    run_id, claim_id, claim_seq, outcome, tenant, request_id, protection_mode,
    threshold_blocks, ttl_s, value,
    -- NOTE: value is all-or-nothing: a harmed claim loses all of it
    CASE outcome WHEN {claim_outcome.harmed} THEN value WHEN {claim_outcome.unknown} THEN NULL ELSE 0.0 END AS value_lost,
    first_harm_seq, first_harm_ts_ns, first_harm_by_request_id,
    blocks_lost_harm, blocks_lost_expiry, blocks_lost_relaxation, blocks_lost_eviction,
    blocks_lost_unknown,
    submitted_seq, accepted_seq, rejected_seq, reject_reason, materialized_seq,
    reported_materialized_seq, release_seq, release_event, released_by, release_refusals,
    release_refused_seqs, reported_harm_seq, positions_bound,
    -- true when its blocks are pinned while in force (a pinning mode under an enforcing policy)
    pinned_mode
FROM o
ORDER BY run_id, claim_seq;

CREATE OR REPLACE TABLE requests AS
-- NOTE: one aggregate per event kind (each reads only its own events), then joined: a single
-- GROUP BY with a FILTER per column was the slowest statement of the reconstruction.
WITH arrived AS (
    SELECT run_id, request_id, min(seq) AS arrived_seq, arg_min(tenant, seq) AS tenant,
           arg_min(claim_id, seq) AS claim_id,
           arg_min(num_prompt_tokens, seq) AS num_prompt_tokens
    FROM kv_stage_events WHERE event = {event.request_arrived} AND request_id IS NOT NULL
    GROUP BY run_id, request_id
), steps AS (
    SELECT
        run_id, request_id,
        min(seq) FILTER (WHERE event = {event.request_admitted}) AS admitted_seq,
        max(seq) FILTER (WHERE event = {event.request_admitted}) AS last_admitted_seq,
        count(*) FILTER (WHERE event = {event.request_deferred}) AS deferrals,
        min(seq) FILTER (WHERE event = {event.request_deferred}) AS first_deferred_seq,
        count(*) FILTER (WHERE event = {event.request_preempted}) AS preemptions,
        min(seq) FILTER (WHERE event = {event.request_preempted}) AS first_preempted_seq,
        max(seq) FILTER (WHERE event = {event.request_preempted}) AS last_preempted_seq,
        min(seq) FILTER (WHERE event = {event.reuse_denied}) AS reuse_denied_seq
    FROM kv_stage_events
    WHERE request_id IS NOT NULL
      AND event IN ({event.request_admitted}, {event.request_deferred}, {event.request_preempted}, {event.reuse_denied})
    GROUP BY run_id, request_id
), preempted AS (
    -- issue 8 item 5: what vLLM met when it preempted the request (its first preemption);
    -- the protected blocks rebuilt from the trace (feasibility), the runtime's beside them
    SELECT e.run_id, e.request_id,
           arg_min(f.protected_blocks, e.seq) AS preempted_protected_blocks,
           arg_min(e.protected_blocks, e.seq) AS runtime_preempted_protected_blocks,
           arg_min(e.free_blocks, e.seq) AS preempted_free_blocks,
           arg_min(e.usable_blocks, e.seq) AS preempted_usable_blocks,
           arg_min(e.blocking_claim_ids, e.seq) AS preempted_blocking_claim_ids
    FROM kv_stage_events e
    LEFT JOIN feasibility f ON f.run_id = e.run_id AND f.seq = e.seq
    WHERE e.event = {event.request_preempted} AND e.request_id IS NOT NULL
    GROUP BY e.run_id, e.request_id
), refused AS (
    -- the shortfall rebuilt from the trace (feasibility), the runtime's beside it
    SELECT e.run_id, e.request_id, min(e.seq) AS refused_seq,
           arg_min(e.blocking_claim_ids, e.seq) AS blocking_claim_ids,
           arg_min(f.shortfall_blocks, e.seq) AS shortfall_blocks,
           arg_min(e.shortfall_blocks, e.seq) AS runtime_shortfall_blocks,
           arg_min(e.reason, e.seq) AS refusal_reason
    FROM kv_stage_events e
    LEFT JOIN feasibility f ON f.run_id = e.run_id AND f.seq = e.seq
    WHERE e.event = {event.request_refused} AND e.request_id IS NOT NULL
    GROUP BY e.run_id, e.request_id
), finished AS (
    SELECT run_id, request_id, max(seq) AS finished_seq,
           arg_max(finish_reason, seq) AS finish_reason,
           arg_max(num_cached_tokens, seq) AS num_cached_tokens,
           arg_max(num_output_tokens, seq) AS num_output_tokens
    FROM kv_stage_events WHERE event = {event.request_finished} AND request_id IS NOT NULL
    GROUP BY run_id, request_id
), blocks AS (
    -- from the per-step counts of 05_feasibility (kv_request_blocks)
    SELECT
        run_id, request_id,
        sum(n_allocated)::BIGINT AS blocks_allocated,
        sum(n_cached)::BIGINT AS blocks_cached,
        sum(n_hit)::BIGINT AS blocks_hit,
        sum(n_hit_after_admission)::BIGINT AS hits_after_admission
    FROM kv_request_blocks
    GROUP BY run_id, request_id
), first_refs AS (
    SELECT run_id, request_id, event, claim_id, claim_seq, seq,
           min(seq) OVER (PARTITION BY run_id, request_id, event) AS first_seq
    FROM kv_claim_refs
    WHERE event IN ({event.request_refused}, {event.request_preempted})
), claim_refs AS (
    -- the claim instances named by each request's refusal and first preemption
    SELECT run_id, request_id,
           list(claim_seq ORDER BY claim_id) FILTER (WHERE event = {event.request_refused})
               AS blocking_claim_seqs,
           list(claim_seq ORDER BY claim_id) FILTER (WHERE event = {event.request_preempted})
               AS preempted_blocking_claim_seqs
    FROM first_refs
    WHERE seq = first_seq
    GROUP BY run_id, request_id
), own_claim AS (
    -- the request's own claim instance: the one it submitted
    SELECT run_id, claim_id, request_id, min(claim_seq) AS claim_seq
    FROM kv_claim_facts
    GROUP BY run_id, claim_id, request_id
), a AS (
    SELECT run_id, request_id, arrived_seq, tenant, claim_id, num_prompt_tokens, admitted_seq,
           last_admitted_seq,
           coalesce(deferrals, 0) AS deferrals, first_deferred_seq, refused_seq,
           blocking_claim_ids, shortfall_blocks, runtime_shortfall_blocks, refusal_reason,
           coalesce(preemptions, 0) AS preemptions, first_preempted_seq, last_preempted_seq,
           preempted_protected_blocks, runtime_preempted_protected_blocks, preempted_free_blocks, preempted_usable_blocks,
           preempted_blocking_claim_ids, finished_seq,
           finish_reason, num_cached_tokens, num_output_tokens, reuse_denied_seq,
           coalesce(blocks_allocated, 0) AS blocks_allocated,
           coalesce(blocks_cached, 0) AS blocks_cached,
           coalesce(blocks_hit, 0) AS blocks_hit,
           coalesce(hits_after_admission, 0) AS hits_after_admission
    FROM arrived
    FULL JOIN steps USING (run_id, request_id)
    FULL JOIN preempted USING (run_id, request_id)
    FULL JOIN refused USING (run_id, request_id)
    FULL JOIN finished USING (run_id, request_id)
    FULL JOIN blocks USING (run_id, request_id)
)
SELECT
    a.run_id, a.request_id,
    CASE
        WHEN a.refused_seq IS NOT NULL THEN {request_outcome.refused}
        WHEN a.finished_seq IS NOT NULL
             AND a.finish_reason IN ('abort', {request_outcome.aborted}, 'error', 'cancelled') THEN {request_outcome.aborted}
        -- NOTE: vLLM resumes a preempted request by recomputing it: it finishes, but its KV was
        -- lost mid-flight, which is the outcome an auditor needs to see
        WHEN a.finished_seq IS NOT NULL AND a.preemptions > 0 THEN {request_outcome.preempted}
        WHEN a.finished_seq IS NOT NULL AND a.deferrals > 0 THEN {request_outcome.deferred_then_served}
        WHEN a.finished_seq IS NOT NULL THEN {request_outcome.served}
        -- NOTE: a request that has not finished may still finish behind a hole
        WHEN r.has_hole THEN {request_outcome.unknown}
        WHEN a.preemptions > 0 THEN {request_outcome.preempted}
        ELSE {request_outcome.unknown}
    END AS outcome,
    a.tenant, a.claim_id,
    oc.claim_seq,
    a.num_prompt_tokens, a.arrived_seq, a.admitted_seq, a.deferrals,
    a.first_deferred_seq, a.refused_seq, a.blocking_claim_ids, cr.blocking_claim_seqs,
    a.shortfall_blocks, a.refusal_reason, a.preemptions, a.first_preempted_seq,
    a.last_preempted_seq, a.preempted_protected_blocks, a.preempted_free_blocks,
    a.preempted_usable_blocks, a.preempted_blocking_claim_ids,
    cr.preempted_blocking_claim_seqs, a.finished_seq, a.finish_reason,
    a.num_cached_tokens,
    -- The prefix hit the trace shows for the admission that served the request: its block_hit
    -- events after its last admission, in tokens, capped by vLLM's rule that a prompt is never
    -- served entirely from cache (the last token is recomputed, so a full-prompt hit counts
    -- at most floor((prompt_tokens - 1) / block_size) blocks). Compared with vLLM's own
    -- num_cached_tokens by L7 (docs/conformance.md).
    CASE WHEN r.block_size IS NOT NULL AND a.finished_seq IS NOT NULL THEN
        least(a.hits_after_admission * r.block_size,
              CASE WHEN a.num_prompt_tokens IS NULL THEN NULL
                   ELSE ((a.num_prompt_tokens - 1) // r.block_size) * r.block_size END)
    END AS reconstructed_cached_tokens,
    a.num_output_tokens, a.reuse_denied_seq IS NOT NULL AS reuse_denied,
    a.reuse_denied_seq, a.blocks_allocated, a.blocks_cached, a.blocks_hit,
    -- the runtime's own figures beside the rebuilt ones (shortfall_blocks,
    -- preempted_protected_blocks)
    a.runtime_shortfall_blocks, a.runtime_preempted_protected_blocks
FROM a
JOIN kv_runs r ON r.run_id = a.run_id
LEFT JOIN claim_refs cr ON cr.run_id = a.run_id AND cr.request_id = a.request_id
LEFT JOIN own_claim oc
  ON oc.run_id = a.run_id AND oc.claim_id = a.claim_id AND oc.request_id = a.request_id
ORDER BY a.run_id, coalesce(a.arrived_seq, a.admitted_seq, a.refused_seq), a.request_id;

-- NOTE: `feasibility` is built by 05_feasibility.sql (rebuilt from the block timeline).
