"""A run sealed by an older schema version reads from its ``events.parquet`` without a hole."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from kvclaims.reconstruct.loader import load_runs

RUN = Path(__file__).resolve().parents[1] / "traces/sweep-resident60_active70/" \
    "resident60_active70-native-80"


def test_a_schema_2_sealed_file_reads_whole_with_the_newer_columns_null() -> None:
    assert json.loads((RUN / "manifest.json").read_text())["schema_version"] == 2
    trace = load_runs([RUN])
    assert not trace.truncations and not trace.truncated_runs
    assert trace.events.column("max_num_batched_tokens").null_count == trace.events.num_rows
    assert trace.events.column("step").null_count == 0


def test_a_sealed_file_lacking_a_column_its_version_has_is_not_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    table = pq.read_table(run / "events.parquet").drop_columns(["step"])  # step is schema 2
    pq.write_table(table, run / "events.parquet")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["sealed"]["bytes"] = (run / "events.parquet").stat().st_size
    (run / "manifest.json").write_text(json.dumps(manifest))
    trace = load_runs([run])
    assert any("sealed copy unusable" in t for t in trace.truncations)
