-- Stage 4: the labelled losses, as tables (docs/design.md, "Labels").
-- The labels themselves are decided by stage 03's one ordered pass (reconstruct/labels.py,
-- rule table: kvclaims.reconstruct.labels.rule); this stage only selects its outputs.
-- NOTE: loss_claims (one row per loss x claim instance bound to the lost content) is written
-- by the pass itself in its final shape (labels.LOSS_CLAIMS_DDL), the instance facts taken
-- from kv_claim_facts there: no join and no copy of the largest table here.
-- NOTE: losses is a view over the pass's file (reconstruct/sink.py), not a copy of it: the
-- copy cost an INSERT of every loss, and two statements of the later stages read it.

-- One row per block loss with the most severe label of its claim instances
-- (kvclaims.contract.schema.LABEL_SEVERITY: unknown > harm > expiry > relaxation > eviction).
CREATE OR REPLACE TEMP VIEW losses AS
SELECT run_id, seq, ts_ns, block_id, block_hash, cause, by_request_id, label, claim_ids,
       decided_by_seq, decided_by_claim_id, claim_seq, was_resident, synthetic, step,
       repaired_in_step
FROM kv_losses;
