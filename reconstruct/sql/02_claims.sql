-- Stage 2: claim instances and their lifecycle facts (docs/design.md §2 "Claim instances",
-- §5 "Lifecycle legitimacy"; docs/reconstruction.md "Claim instances").
-- NOTE: claim identity is (run_id, tenant, claim_id, instance): every claim_submitted starts a
-- new instance of its claim_id, keyed by claim_seq (the seq of its claim_submitted, or, for
-- events of an id before any submit (imports, broken traces), the seq of the first event with
-- that id). The decision that follows a submission (claim_accepted, claim_rejected) belongs to
-- it. Every other event of the id belongs to the latest submission not rejected before it: a
-- rejected submission (e.g. another tenant reusing an id in force) never becomes the instance
-- later events refer to; they stay with the instance that owns the id. Joins use
-- (run_id, claim_seq). reconstruct/identity.py applies that rule in one ordered pass per run
-- before the statements below: `kv_claim_ev` (every claim event but bindings, with its
-- claim_seq), `kv_claim_binds` (the bindings, with theirs) and `kv_claim_subs` (each
-- submission, its first rejection, and the latest earlier submission of its id never
-- rejected); reconstruct/labels.py `_instances` applies the same rule.

-- One row per claim instance: what was declared and decided (no lifecycle end yet).
-- NOTE: an instance's bindings (kv_claim_binds) and its other events (kv_claim_ev) are
-- aggregated apart and joined whole: an instance may have either without the other.
CREATE OR REPLACE TEMP TABLE kv_claim_inst AS
WITH ev AS (
    SELECT
        run_id, claim_seq, any_value(claim_id) AS claim_id,
        min(seq) FILTER (WHERE event = {event.claim_submitted}) AS submitted_seq,
        arg_min(tenant, seq) FILTER (WHERE event = {event.claim_submitted}) AS tenant,
        arg_min(request_id, seq) FILTER (WHERE event = {event.claim_submitted}) AS request_id,
        arg_min(protection_mode, seq) FILTER (WHERE event = {event.claim_submitted}) AS declared_mode,
        arg_min(threshold_blocks, seq) FILTER (WHERE event = {event.claim_submitted})
            AS declared_threshold,
        arg_min(ttl_s, seq) FILTER (WHERE event = {event.claim_submitted}) AS ttl_s,
        arg_min(value, seq) FILTER (WHERE event = {event.claim_submitted}) AS declared_value,
        min(seq) FILTER (WHERE event = {event.claim_accepted}) AS accepted_seq,
        arg_min(ts_ns, seq) FILTER (WHERE event = {event.claim_accepted}) AS accepted_ts_ns,
        min(seq) FILTER (WHERE event = {event.claim_rejected}) AS rejected_seq,
        arg_min(reason, seq) FILTER (WHERE event = {event.claim_rejected}) AS reject_reason,
        min(seq) FILTER (WHERE event = {event.claim_demoted}) AS demoted_seq,
        min(seq) FILTER (WHERE event = {event.claim_expired}) AS expired_seq,
        arg_min(ts_ns, seq) FILTER (WHERE event = {event.claim_expired}) AS expired_ts_ns,
        min(seq) FILTER (WHERE event = {event.claim_released}) AS released_seq,
        min(seq) FILTER (WHERE event = {event.claim_materialized}) AS reported_materialized_seq,
        list(seq ORDER BY seq) FILTER (WHERE event = {event.claim_materialized})
            AS reported_materialized_seqs,
        min(seq) FILTER (WHERE event = {event.claim_harmed}) AS reported_harm_seq,
        list(seq ORDER BY seq) FILTER (WHERE event = {event.claim_harmed}) AS reported_harm_seqs
    FROM kv_claim_ev
    GROUP BY run_id, claim_seq
), bound AS (
    SELECT
        run_id, claim_seq, any_value(claim_id) AS claim_id,
        count(DISTINCT position) FILTER (WHERE position >= 0) AS positions_bound,
        max(position) AS max_position,
        -- slots of the labelling pass: positions a usable binding can take
        coalesce(max(position) FILTER (WHERE position >= 0 AND block_hash IS NOT NULL), -1) + 1
            AS n_slots
    FROM kv_claim_binds
    GROUP BY run_id, claim_seq
), f AS (
    SELECT run_id, claim_seq, coalesce(ev.claim_id, bound.claim_id) AS claim_id,
           ev.* EXCLUDE (run_id, claim_seq, claim_id),
           coalesce(bound.positions_bound, 0) AS positions_bound, bound.max_position,
           coalesce(bound.n_slots, 0) AS n_slots
    FROM ev FULL JOIN bound USING (run_id, claim_seq)
)
SELECT
    f.*,
    -- a claim that states no mode gets its run policy's default mode (kvclaims/contract/policies.py)
    coalesce(f.declared_mode, p.default_mode) AS protection_mode,
    coalesce(r.enforcing, false) AND coalesce(f.declared_mode, p.default_mode) IN
        ({mode.hard_protected}, {mode.demotable}, {mode.expiring}) AS pinned_mode,
    -- NOTE: leading_prefix_at_least(k); without a declared threshold the claim covers every
    -- bound position (the arbiter does the same: threshold = number of bound blocks).
    coalesce(declared_threshold, max_position + 1) AS k,
    coalesce(declared_value, 1.0) AS value
FROM f
LEFT JOIN kv_runs r ON r.run_id = f.run_id
LEFT JOIN kv_policies p ON p.policy = r.policy;

-- -- lifecycle legitimacy (docs/design.md §5) -------------------------------------------------
-- Every claim_demoted / claim_expired / claim_released of an instance, and whether the contract
-- lets it end the instance's force (`legit`). `rule` names the rule an illegitimate end breaks
-- (NULL when legitimate); `verified` is false where the source format never carries the field
-- the rule reads (the paper prototype's telemetry: no ttl_s, no released_by; schema-1 traces:
-- no released_by): the runtime's reading is then kept and a finding marks it unverified.
-- NOTE: the rule table here, labels.LIFECYCLE_RULES and docs/design.md §5 state the same rules
-- (tests/test_lifecycle_legitimacy.py compares them).
CREATE OR REPLACE TEMP TABLE kv_lifecycle_ends AS
WITH ends AS (
    SELECT e.run_id, e.seq, e.ts_ns, e.step, e.event, e.claim_id, e.claim_seq,
           e.tenant AS event_tenant, e.released_by, e.by_request_id, e.reason,
           i.tenant AS claim_tenant, i.protection_mode, i.ttl_s, i.accepted_seq,
           i.accepted_ts_ns, r.lifecycle_source, r.released_by_recorded,
           CASE e.event
               WHEN {event.claim_demoted} THEN
                   CASE WHEN i.protection_mode IS DISTINCT FROM {mode.demotable}
                        THEN {finding.demoted_not_demotable} END
               WHEN {event.claim_expired} THEN
                   CASE WHEN i.protection_mode IS DISTINCT FROM {mode.expiring}
                            THEN {finding.expired_not_expiring}
                        WHEN i.ttl_s IS NULL THEN {finding.expired_without_ttl}
                        WHEN i.accepted_ts_ns IS NULL
                             OR e.ts_ns < i.accepted_ts_ns + CAST(i.ttl_s * 1e9 AS BIGINT)
                            THEN {finding.expired_before_ttl} END
               WHEN {event.claim_released} THEN
                   CASE WHEN e.released_by = {releaser.operator} THEN NULL
                        WHEN e.released_by = {releaser.tenant} AND e.tenant IS NOT NULL
                             AND e.tenant = i.tenant THEN NULL
                        WHEN e.released_by = {releaser.tenant} THEN {finding.released_not_by_owner}
                        -- NOTE: the arbiter ends a claim only by claim_demoted or
                        -- claim_expired, each judged by its own rule above
                        WHEN e.released_by = {releaser.arbiter} THEN {finding.released_by_arbiter}
                        ELSE {finding.released_by_unknown} END
           END AS broken_rule
    FROM kv_claim_ev e
    JOIN kv_claim_inst i ON i.run_id = e.run_id AND i.claim_seq = e.claim_seq
    JOIN kv_runs r ON r.run_id = e.run_id
    WHERE e.event IN ({event.claim_demoted}, {event.claim_expired}, {event.claim_released})
)
SELECT * EXCLUDE (unreadable),
       -- the rule held, or it broke on a field the format records: the verdict is the trace's
       broken_rule IS NULL OR NOT unreadable AS verified,
       -- the rule broke on a field the format never carries: the runtime's word is kept
       broken_rule IS NULL OR unreadable AS legit
FROM (SELECT *,
             (lifecycle_source = {lifecycle_source.prototype} AND event IN ({event.claim_demoted}, {event.claim_expired}))
             OR (NOT released_by_recorded AND event = {event.claim_released}) AS unreadable
      FROM ends);

-- One row per claim instance, with the lifecycle end that ended its force: the first
-- legitimate claim_demoted / claim_expired / claim_released (an illegitimate one leaves the
-- instance in force; findings name it).
CREATE OR REPLACE TEMP TABLE kv_claim_facts AS
WITH rel AS (
    SELECT run_id, claim_seq,
           min(seq) AS release_seq,
           arg_min(event, seq) AS release_event,
           arg_min(released_by, seq) AS release_released_by
    FROM kv_lifecycle_ends
    WHERE legit
    GROUP BY run_id, claim_seq
)
SELECT i.*, rel.release_seq, rel.release_event, rel.release_released_by
FROM kv_claim_inst i
LEFT JOIN rel ON rel.run_id = i.run_id AND rel.claim_seq = i.claim_seq;
