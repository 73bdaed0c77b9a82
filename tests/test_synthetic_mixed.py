"""The benchmarks' ``mixed`` shape (many short runs, mixed policies, long-lived claims) is a
valid trace: it opens through ``kvclaims.open`` and its claims end long after their blocks go."""

from __future__ import annotations

from pathlib import Path

import kvclaims
from kvclaims.sources import synthetic


def test_mixed_shape_opens_with_its_policies_and_long_lived_claims(tmp_path: Path) -> None:
    n = synthetic.write_mixed(tmp_path / "mixed", 90_000, runs=3)
    audit = kvclaims.open([tmp_path / "mixed"], reuse=False)
    con = audit.con
    assert con.sql("SELECT count(*) FROM events").fetchall()[0][0] == n
    assert con.sql("SELECT run_id, policy FROM kv_runs ORDER BY run_id").fetchall() == [
        (f"mixed-{i:03d}", synthetic.MIXED_POLICIES[i]) for i in range(3)]
    labels = {r[0] for r in con.sql("SELECT DISTINCT label FROM losses").fetchall()}
    assert {"harm", "eviction", "relaxation"} <= labels
    # long-lived: some claim instance is released after a block it binds was lost
    assert con.sql("SELECT count(*) FROM loss_claims WHERE release_event = 'claim_released' "
                   "AND release_seq > seq AND label = 'harm'").fetchall()[0][0] > 0
