"""The benchmark scripts write their figures into their own sections of docs/benchmarks.md
(benchmarks/_report.py); every other byte of the file stays as it was."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import _report

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
# NOTE: the sections each script writes (fleet.py and whatif.py write their own, the same way)
SCRIPT_SECTIONS = {
    "recorder_cost.py": ["recorder_cost"],
    "recorder_overhead.py": ["recorder_overhead.engine", "recorder_overhead.writer",
                             "recorder_overhead.lockstep", "recorder_overhead.claim_path"],
    "reconstruct.py": ["reconstruct."],
    "read_events.py": ["read_events"],
    "listener.py": ["listener"],
    "stages.py": ["stages"],
}

OTHERS = ("# Figures\n\nprose before\n\n<!-- fleet:begin -->\nfleet table\n<!-- fleet:end -->\n\n"
          "middle prose\n\n<!-- listener:begin -->\nold listener table\n<!-- listener:end -->\n\n"
          "prose after\n")


def _write(doc: Path, name: str, body: str) -> str:
    _report.write_section(name, body, doc, command="python benchmarks/x.py --flag")
    return doc.read_text()


def test_section_is_replaced_and_everything_else_kept_byte_for_byte(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(OTHERS)
    text = _write(doc, "listener", "| a |\n| --- |\n| 1 |")
    before, _, rest = OTHERS.partition("<!-- listener:begin -->")
    _, _, after = rest.partition("<!-- listener:end -->")
    assert text.startswith(before) and text.endswith(after)
    assert "old listener table" not in text and "| 1 |" in text
    assert "fleet table" in text


def test_section_names_the_command_the_date_and_the_machine(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    text = _write(doc, "listener", "table")
    head = text.split("<!-- listener:begin -->\n", 1)[1].splitlines()[0]
    assert head.startswith("`python benchmarks/x.py --flag` — ")
    assert re.search(r" — \d{4}-\d\d-\d\d \d\d:\d\d UTC — \d+ cores \(", head)
    assert "Python 3." in head


def test_missing_section_is_appended_at_the_end(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(OTHERS)
    text = _write(doc, "stages", "stage table")
    assert text.startswith(OTHERS.rstrip("\n"))
    assert text.rstrip().endswith("stage table\n<!-- stages:end -->")


def test_new_file_starts_with_the_section(tmp_path: Path) -> None:
    text = _write(tmp_path / "new.md", "listener", "table")
    assert text.startswith("<!-- listener:begin -->\n") and text.endswith("<!-- listener:end -->\n")


def test_unbalanced_markers_are_refused_and_the_file_left_alone(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    broken = OTHERS.replace("<!-- listener:end -->", "")
    doc.write_text(broken)
    with pytest.raises(ValueError, match="section listener"):
        _write(doc, "listener", "new table")
    assert doc.read_text() == broken


def test_doc_dash_writes_nothing(tmp_path: Path) -> None:
    assert _report.write_section("listener", "table", "-") is None
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("script", sorted(SCRIPT_SECTIONS))
def test_each_benchmark_script_writes_its_section(script: str) -> None:
    source = (REPO / "benchmarks" / script).read_text()
    assert "_report.write_section(" in source and "_report.add_doc_option(ap)" in source
    for name in SCRIPT_SECTIONS[script]:
        assert f'"{name}' in source


@pytest.mark.parametrize("name", [n for names in SCRIPT_SECTIONS.values() for n in names
                                  if not n.endswith(".")] + ["reconstruct.10M"])
def test_docs_benchmarks_holds_each_section_once(name: str) -> None:
    text = DOC.read_text()
    assert text.count(f"<!-- {name}:begin -->") == 1
    assert text.count(f"<!-- {name}:end -->") == 1
    assert text.index(f"<!-- {name}:begin -->") < text.index(f"<!-- {name}:end -->")
