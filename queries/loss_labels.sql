-- loss_labels: how many block losses each run has per label, with the seq range they span.
-- One row per (run, label). Labels (DESCRIPTION in docs/reconstruction.md): harm, unknown,
-- expiry, relaxation, eviction. Needs the reconstructed table `losses`.
CREATE OR REPLACE VIEW loss_labels AS
SELECT
    -- the run the losses belong to
    run_id,
    -- the block label: the most severe of the labels of the claims bound to the lost content
    label,
    -- number of block losses with this label
    count(*) AS blocks_lost,
    -- seq of the first loss with this label
    min(seq) AS first_seq,
    -- seq of the last loss with this label
    max(seq) AS last_seq,
    -- how many of them came from a cache_reset (synthetic loss rows)
    count(*) FILTER (WHERE cause = {cause.reset}) AS from_reset
FROM losses
GROUP BY run_id, label
ORDER BY run_id, label;
