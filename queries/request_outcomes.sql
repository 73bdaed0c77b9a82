-- request_outcomes: what happened to every request, and which claims blocked it.
-- One row per (run, request). Needs the reconstructed table `requests`.
CREATE OR REPLACE VIEW request_outcomes AS
SELECT
    -- the run the request belongs to
    run_id,
    -- the request's id
    request_id,
    -- the tenant that sent it
    tenant,
    -- served | deferred_then_served | refused | preempted | aborted | unknown
    outcome,
    -- how many times the arbiter deferred it
    deferrals,
    -- the claims its refusal named (NULL unless refused)
    blocking_claim_ids,
    -- blocks missing at the refusal: protected + live + required - usable (rebuilt from the
    -- trace; NULL when the trace does not show the request's need)
    shortfall_blocks,
    -- prompt tokens served from the prefix cache
    num_cached_tokens,
    -- true when write no-admit kept its blocks from becoming reusable
    reuse_denied,
    -- seq of the refusal, else of the finish (NULL if neither)
    coalesce(refused_seq, finished_seq) AS decided_seq
FROM requests
ORDER BY run_id, arrived_seq NULLS LAST, request_id;
