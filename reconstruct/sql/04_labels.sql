-- Stage 4: the labelled losses, as tables (docs/design.md, "Labels").
-- The labels themselves are decided by stage 03's one ordered pass (reconstruct/labels.py,
-- rule table: kvclaims.reconstruct.labels.rule); this stage only selects and joins its outputs.

-- One row per block loss with the most severe label of its claim instances
-- (kvclaims.contract.schema.LABEL_SEVERITY: unknown > harm > expiry > relaxation > eviction).
CREATE OR REPLACE TABLE losses AS
SELECT run_id, seq, ts_ns, block_id, block_hash, cause, by_request_id, label, claim_ids,
       decided_by_seq, decided_by_claim_id, claim_seq, was_resident, synthetic, step,
       repaired_in_step
FROM kv_losses;

-- One row per (loss, claim instance with a current binding to the lost hash made before it).
CREATE OR REPLACE TABLE loss_claims AS
SELECT p.run_id, p.seq, p.ts_ns, p.block_id, p.block_hash, f.claim_id, p.claim_seq,
       p.position, p.label, p.decided_by_seq, f.tenant, f.protection_mode,
       f.k AS threshold_blocks, f.accepted_seq, m.materialized_seq, f.release_seq,
       f.release_event, p.predicate_before, p.predicate_after,
       (p.predicate_before AND NOT p.predicate_after) AS breaks_predicate, p.broken_seq,
       p.by_request_id, p.step, p.repaired_in_step
FROM kv_loss_pairs p
JOIN kv_claim_facts f ON f.run_id = p.run_id AND f.claim_seq = p.claim_seq
LEFT JOIN kv_materialized m ON m.run_id = p.run_id AND m.claim_seq = p.claim_seq;
