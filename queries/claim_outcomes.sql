-- claim_outcomes: the final outcome of every claim, with what it cost and when it broke.
-- One row per (run, claim). Needs the reconstructed table `claims`.
CREATE OR REPLACE VIEW claim_outcomes AS
SELECT
    -- the run the claim belongs to
    run_id,
    -- the claim's id as declared
    claim_id,
    -- the tenant that declared it
    tenant,
    -- effective protection mode (declared, else the run policy's default)
    protection_mode,
    -- rejected | never_materialized | preserved | harmed | demoted | expired | released | unknown
    outcome,
    -- the claim's value lost: all of it if harmed (all-or-nothing), NULL if unknown
    value_lost,
    -- seq of the first loss labelled harm for this claim (NULL if never harmed)
    first_harm_seq,
    -- the request whose allocation caused that first harm
    first_harm_by_request_id,
    -- seq at which the predicate first held while in force (NULL: never materialized)
    materialized_seq,
    -- seq of the release (demote, expire, release) that ended the claim's force
    release_seq,
    -- bound blocks lost, by label
    blocks_lost_harm,
    -- bound blocks lost after expiry
    blocks_lost_expiry,
    -- bound blocks lost after a demotion or release
    blocks_lost_relaxation,
    -- bound blocks lost without breaking the claim (or before it was accepted)
    blocks_lost_eviction,
    -- bound blocks lost behind a hole in the evidence
    blocks_lost_unknown
FROM claims
ORDER BY run_id, claim_id;
