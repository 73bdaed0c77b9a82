-- tenant_explanations: one plain-language sentence per claim that lost blocks because it was
-- harmed, relaxed (demoted or released) or expired: what a tenant is told, with the evidence.
-- NOTE: a sentence never names another tenant's request, claim or tenant: the request that
-- caused a harm is named only when it is the tenant's own, else it is "another tenant's
-- request". The full post-incident explanation is `kvclaims explain` (docs/explain.md).
-- Needs the reconstructed tables `claims` and `requests`.
CREATE OR REPLACE VIEW tenant_explanations AS
WITH c AS (
    SELECT c.*,
           CASE WHEN c.first_harm_by_request_id IS NULL THEN 'a request the trace does not name'
                WHEN q.tenant IS NOT NULL AND q.tenant = c.tenant
                    THEN 'your own request ' || c.first_harm_by_request_id
                ELSE 'another tenant''s request' END AS harmed_by
    FROM claims c
    LEFT JOIN requests q ON q.run_id = c.run_id AND q.request_id = c.first_harm_by_request_id
)
SELECT
    -- the run the claim belongs to
    c.run_id,
    -- the tenant the sentence is for
    c.tenant,
    -- the claim it explains
    c.claim_id,
    -- the claim's outcome: harmed | demoted | expired | released
    c.outcome,
    -- the sentence
    CASE c.outcome
        WHEN {claim_outcome.harmed} THEN format(
            'Your claim {} was accepted (seq {}) and materialized (seq {}), but block loss at '
            'seq {} by {} broke it while it was still in force: {} block(s) lost as harm, '
            'value lost {}.', c.claim_id, c.accepted_seq, c.materialized_seq,
            c.first_harm_seq, c.harmed_by, c.blocks_lost_harm, c.value_lost)
        WHEN {claim_outcome.demoted} THEN format(
            'Your claim {} was demoted at seq {} to make room for other work; {} of its blocks '
            'were lost afterwards as ordinary cache entries (relaxation), not as a broken '
            'promise.', c.claim_id, c.release_seq, c.blocks_lost_relaxation)
        WHEN {claim_outcome.released} THEN format(
            'Your claim {} was released at seq {}; {} of its blocks were lost afterwards '
            '(relaxation).', c.claim_id, c.release_seq, c.blocks_lost_relaxation)
        WHEN {claim_outcome.expired} THEN format(
            'Your claim {} expired at seq {} after its ttl of {} s; {} of its blocks were lost '
            'afterwards (expiry).', c.claim_id, c.release_seq, c.ttl_s, c.blocks_lost_expiry)
    END AS explanation,
    -- seqs that prove the sentence: acceptance, release or first harm
    [v FOR v IN [c.accepted_seq, c.materialized_seq, c.release_seq, c.first_harm_seq]
     IF v IS NOT NULL] AS evidence_seqs
FROM c
WHERE c.outcome IN ({claim_outcome.harmed}, {claim_outcome.demoted}, {claim_outcome.released}, {claim_outcome.expired})
  AND (c.blocks_lost_harm + c.blocks_lost_relaxation + c.blocks_lost_expiry) > 0
ORDER BY c.run_id, c.tenant, c.claim_id;
