"""Conformance checks: each passes on its fixture, fails on a mutated twin (docs/conformance.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from kvclaims.cli import main
from kvclaims.cli.reconstruct import EVIDENCE_SHOWN
from kvclaims.reconstruct import core, loader
from kvclaims.sources import shapes
from kvclaims.sources.jsonl import events_to_table
from tests import feasibility_shapes as fs

Events = list[dict]
FIX = Path(__file__).parent / "fixtures"


def verdicts(events: Events) -> dict[str, str]:
    """Reconstruct events (renumbered densely, as a runtime would write them) -> verdicts."""
    events = [{**e, "seq": i} for i, e in enumerate(events)]
    batches = [loader.decode_batch(b) for b in events_to_table(events).to_batches()]
    t = core.reconstruct(pa.Table.from_batches(batches, schema=loader.EVENTS_SCHEMA))
    return dict(t.con.sql('SELECT "check", verdict FROM conformance').fetchall())


def shape(name: str) -> Events:
    return {**shapes.SHAPES, **fs.SHAPES}[name]()


def idx(events: Events, event: str, **match: object) -> int:
    return next(i for i, e in enumerate(events)
                if e["event"] == event and all(e.get(k) == v for k, v in match.items()))


def swap(events: Events, i: int, j: int) -> Events:
    events[i], events[j] = events[j], events[i]
    return events


def drop(events: Events, event: str) -> Events:
    return [e for e in events if e["event"] != event]


# -- mutations ---------------------------------------------------------------------------------

def accept_removed(e: Events) -> Events:
    return drop(e, "claim_accepted")


def reuse_denied_not_honoured(e: Events) -> Events:
    i = idx(e, "request_arrived", request_id="active")
    e.insert(i + 1, {**e[i], "event": "reuse_denied", "tenant": None, "num_prompt_tokens": None,
                     "claim_id": None})
    return [{k: v for k, v in ev.items() if v is not None} for ev in e]


def refusal_claim_id_changed(e: Events) -> Events:
    for ev in e:
        if ev["event"] in ("request_deferred", "request_refused"):
            ev["blocking_claim_ids"] = ["claim:other"]
    return e


def release_swapped_with_first_loss(release: str) -> Callable[[Events], Events]:
    def mutate(e: Events) -> Events:
        return swap(e, idx(e, release), idx(e, "block_evicted"))
    return mutate


def expire_removed(e: Events) -> Events:
    return drop(e, "claim_expired")


def harm_report_removed(e: Events) -> Events:
    return drop(e, "claim_harmed")


def policy_turned_enforcing(e: Events) -> Events:
    """The unenforced probe under an enforcing policy: the active request is admitted (and
    allocates its 70 blocks) while the claim's 60 blocks are protected: 130 > 80."""
    e[idx(e, "run_started")]["policy"] = "hard_protected"
    return e


TWINS = [
    ("L1", "native_60_70_80", "unenforced_60_70_80", accept_removed),
    ("L2", "write_no_admit_60_70_80", "native_60_70_80", reuse_denied_not_honoured),
    ("L3", "hard_60_70_80", "hard_60_70_80", refusal_claim_id_changed),
    ("L4", "demote_60_70_80", "demote_60_70_80", release_swapped_with_first_loss("claim_demoted")),
    ("L5", "ttl_60_70_80", "ttl_60_70_80", release_swapped_with_first_loss("claim_expired")),
    ("L6", "l6_position_zero", None, None),
    ("L7", "unenforced_60_70_80", "unenforced_60_70_80", harm_report_removed),
    ("INV_no_harm_without_acceptance", "unenforced_60_70_80", "unenforced_60_70_80",
     accept_removed),
    ("INV_release_precedes_loss", "demote_60_70_80", "demote_60_70_80",
     release_swapped_with_first_loss("claim_demoted")),
    ("INV_refusal_names_protected_claim", "hard_60_70_80", "hard_60_70_80",
     refusal_claim_id_changed),
    # NOTE: a loss while the hard claim is in force (of another block) exercises it; the
    # 60/70/80 refusal, with no loss at all, does not
    ("INV_no_protected_loss", "hard_unrelated_loss", "ttl_60_70_80", expire_removed),
    # NOTE: an admission while claims protect blocks; the demotion fixture admits with none
    ("INV_feasible_admission", "hard_60_70_130", "unenforced_60_70_80",
     policy_turned_enforcing),
]


@pytest.mark.parametrize("check,fixture", [(c, f) for c, f, _, _ in TWINS])
def test_check_passes_on_its_fixture(check: str, fixture: str) -> None:
    assert verdicts(shape(fixture))[check] == "pass"


@pytest.mark.parametrize("check,fixture,mutate",
                         [(c, f, m) for c, _, f, m in TWINS if m is not None])
def test_check_fails_on_its_mutated_twin(check: str, fixture: str, mutate) -> None:
    assert verdicts(mutate(shape(fixture)))[check] == "fail"


def test_l6_fails_when_runtime_counts_surviving_blocks() -> None:
    assert verdicts(shapes.l6_position_zero(report_materialized=True))["L6"] == "fail"


def test_checks_not_exercised_without_their_situation() -> None:
    v = verdicts(shape("native_60_70_80"))
    assert (v["L3"], v["L4"], v["L5"]) == ("not_exercised",) * 3


def test_checks_exercised_by_their_situation_are_judged() -> None:
    assert verdicts(shape("hard_60_70_80"))["L3"] == "pass"
    assert verdicts(shape("demote_60_70_80"))["L4"] == "pass"
    assert verdicts(shape("ttl_60_70_80"))["L5"] == "pass"


def test_clean_runs_fail_no_check() -> None:
    for name in ("native_60_70_80", "write_no_admit_60_70_80", "unenforced_60_70_80",
                 "hard_60_70_80", "demote_60_70_80", "ttl_60_70_80", "hard_60_70_130",
                 "l6_position_zero", "multi_claim", "rematerialize", "reset", "threshold"):
        assert "fail" not in verdicts(shape(name)).values(), name


def test_gap_makes_passing_verdicts_unknown() -> None:
    v = verdicts(shape("gap"))
    assert v["INV_no_harm_without_acceptance"] == "unknown"
    assert "pass" not in v.values()


def conformance_cli(path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    main(["conformance", str(path), *flags])
    return capsys.readouterr().out


def cli_line(out: str, check: str) -> str:
    return next(line for line in out.splitlines() if line.split()[:1] == [check])


def test_cli_conformance_says_how_many_evidence_seqs_it_leaves_out(capsys) -> None:
    rows = {r["check"]: r for r in json.loads(conformance_cli(FIX / "native_60_70_80.jsonl",
                                                              capsys, "--json"))}
    seqs, n = rows["L1"]["evidence_seqs"], rows["L1"]["evidence_seq_count"]
    assert n > len(seqs) > EVIDENCE_SHOWN
    line = cli_line(conformance_cli(FIX / "native_60_70_80.jsonl", capsys), "L1")
    assert (f" seq {','.join(map(str, seqs[:EVIDENCE_SHOWN]))} ... and "
            f"{n - EVIDENCE_SHOWN:,} more ") in line


def test_cli_conformance_shows_every_evidence_seq_of_a_short_list(capsys) -> None:
    rows = {r["check"]: r for r in json.loads(conformance_cli(FIX / "hard_60_70_80.jsonl",
                                                              capsys, "--json"))}
    check, seqs = next((c, r["evidence_seqs"]) for c, r in rows.items()
                       if 0 < r["evidence_seq_count"] == len(r["evidence_seqs"]) <= EVIDENCE_SHOWN)
    line = cli_line(conformance_cli(FIX / "hard_60_70_80.jsonl", capsys), check)
    assert f" seq {','.join(map(str, seqs))}  " in line and " more " not in line


def test_cli_conformance_exit_status_is_nonzero_on_failure(tmp_path: Path, capsys) -> None:
    assert main(["conformance", str(FIX / "hard_60_70_80.jsonl")]) == 0
    bad = tmp_path / "bad.jsonl"
    events = refusal_claim_id_changed(shape("hard_60_70_80"))
    bad.write_text(shapes.to_jsonl(events))
    assert main(["conformance", str(bad), "--json"]) == 1
    assert '"verdict": "fail"' in capsys.readouterr().out
