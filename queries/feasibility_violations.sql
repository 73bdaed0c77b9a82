-- feasibility_violations: admission decisions that break the capacity rule (protected +
-- active live <= usable, rebuilt: the live blocks of the running requests + the request's own
-- need).
-- One row per offending decision: an admission that did not
-- fit (something protected had to give), or a deferral/refusal that would have fit (a claim
-- blocked a request it did not need to). Needs the reconstructed table `feasibility`.
CREATE OR REPLACE VIEW feasibility_violations AS
SELECT
    -- the run
    run_id,
    -- seq of the decision
    seq,
    -- time (ns, the recorder's monotonic clock)
    ts_ns,
    -- time in UTC (NULL when the run has no wall-clock anchor)
    ts,
    -- the request decided on
    request_id,
    -- admitted | deferred | refused
    decision,
    -- infeasible_admission (admitted, did not fit) | needless_refusal (deferred or refused,
    -- would have fit)
    CASE WHEN decision = {decision.admitted} THEN {finding.infeasible_admission} ELSE 'needless_refusal' END
        AS violation,
    -- blocks protected by claims in force (rebuilt from the block timeline)
    protected_blocks,
    -- blocks the other running requests held (rebuilt)
    live_blocks,
    -- blocks the request needed: its prompt's blocks not hit in the cache (rebuilt)
    required_blocks,
    -- usable blocks in the pool
    usable_blocks,
    -- protected + live + required - usable (rebuilt; 0 when it fit)
    shortfall_blocks,
    -- the runtime's own protected figure at the decision (0 under a policy that protects nothing)
    runtime_protected_blocks,
    -- the runtime's own required figure at the decision
    runtime_required_blocks,
    -- the run policy (run_started)
    policy,
    -- whether the policy enforces claims
    enforcing
FROM feasibility
WHERE (decision = {decision.admitted} AND NOT feasible)
   OR (decision IN ({decision.deferred}, {decision.refused}) AND feasible)
ORDER BY run_id, seq;
