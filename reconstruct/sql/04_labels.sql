-- Stage 4: the labelled losses, as tables (docs/design.md, "Labels").
-- The labels themselves are decided by stage 03's one ordered pass (reconstruct/labels.py,
-- rule table: kvclaims.reconstruct.labels.rule); this stage only selects its outputs.
-- NOTE: loss_claims (one row per loss x claim instance bound to the lost content) is written
-- by the pass itself in its final shape (labels.LOSS_CLAIMS_DDL), the instance facts taken
-- from kv_claim_facts there: no join and no copy of the largest table here.

-- One row per block loss with the most severe label of its claim instances
-- (kvclaims.contract.schema.LABEL_SEVERITY: unknown > harm > expiry > relaxation > eviction).
-- NOTE: the pass's own table renamed, no copy: its columns after repaired_in_step (the
-- pass's facts per loss that only stages 07-08 read) are dropped where 08 ends.
ALTER TABLE kv_losses RENAME TO losses;
