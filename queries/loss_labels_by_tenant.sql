-- loss_labels_by_tenant: how many claimed blocks each tenant lost per label, per run.
-- One row per (run, tenant, label). A block bound to several claims of one tenant counts once
-- for that tenant; bound to claims of two tenants, it counts once for each. Losses of content
-- no claim was bound to belong to no tenant and are not here (see `loss_labels`).
-- Needs the reconstructed table `loss_claims`.
CREATE OR REPLACE VIEW loss_labels_by_tenant AS
SELECT
    -- the run the losses belong to
    run_id,
    -- the tenant whose claims were bound to the lost content (NULL: a claim without tenant)
    tenant,
    -- the label of the loss for that tenant's claim (harm | unknown | expiry | relaxation |
    -- eviction); when two of its claims label one loss differently, each label counts it
    label,
    -- distinct block losses (seq, block) with this label for this tenant
    count(DISTINCT (seq, block_id)) AS blocks_lost,
    -- distinct claims of this tenant that lost a block with this label
    count(DISTINCT claim_id) AS claims,
    -- seq of the first such loss
    min(seq) AS first_seq,
    -- seq of the last such loss
    max(seq) AS last_seq
FROM loss_claims
GROUP BY run_id, tenant, label
ORDER BY run_id, tenant NULLS LAST, label;
