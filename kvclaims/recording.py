"""``kvclaims record`` and ``kvclaims sweep``: record on real vLLM, then let the reconstructor
decide what happened. They compose the parts in data-flow order (recorder -> run directories ->
reconstructor -> queries); no part calls back into an earlier one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from recorder.policies import POLICIES
from recorder.scenarios import SCENARIOS
from recorder.schema import InputError

SWEEP_COLUMNS = ("run_id", "policy", "usable_blocks", "active_outcome", "resident_blocks_lost",
                 "claim_outcome", "blocking_claim_ids", "shortfall_blocks", "harm", "expiry",
                 "relaxation", "eviction", "unknown", "blocks_lost")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``record`` and ``sweep``."""
    p = sub.add_parser(
        "record", help="record a built-in scenario on a real vLLM engine",
        description="Record a built-in scenario into a run directory on one fresh vLLM engine "
                    "(the tiny local model unless --model is given), then print what the "
                    "reconstructor says happened to its claims, resident blocks and requests.")
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    p.add_argument("--usable-blocks", type=int, default=None,
                   help="usable KV blocks (vLLM gets one more, its null block); "
                        "default: the scenario's own")
    p.add_argument("--policy", choices=sorted(POLICIES), default=None,
                   help="run policy; default: the scenario's own")
    p.add_argument("--out", required=True, type=Path, help="run directory to create")
    p.add_argument("--model", type=Path, default=None,
                   help="model folder (default: the tiny random-weight model, built locally)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_record)

    s = sub.add_parser(
        "sweep", help="record a scenario over capacities x policies and tabulate it",
        description="One fresh vLLM engine per (policy, capacity) point, a run directory per "
                    "point under --out, DIR/sweep.json and a printed table. Resumable: points "
                    "whose run directory is complete are skipped.")
    s.add_argument("--scenario", default="resident60_active70", choices=sorted(SCENARIOS))
    s.add_argument("--capacities", default="80,90,100,110,120,130,150",
                   help="comma-separated usable block counts")
    s.add_argument("--policies", default="native,write_no_admit,hard_protected",
                   help="comma-separated run policies")
    s.add_argument("--out", required=True, type=Path, help="sweep directory")
    s.add_argument("--model", type=Path, default=None, help="model folder (default: tiny)")
    s.add_argument("--json", action="store_true", help="print the rows as JSON")
    s.set_defaults(func=_sweep)


# -- record ---------------------------------------------------------------------------------------

def _quiet_vllm() -> None:
    """vLLM logs to stdout, where our result (and ``--json``) goes: send its log to stderr and
    keep only its errors (a user's own settings win)."""
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def _record(args: argparse.Namespace) -> int:
    from recorder.scenarios import record

    _quiet_vllm()

    view = record(args.scenario, args.usable_blocks, args.policy, args.out, model_dir=args.model)
    claims, losses = _claims_and_losses(args.out)
    if args.json:
        print(json.dumps({**view, "run_dir": str(args.out), "claims": claims,
                          "losses_by_label": losses}, indent=2, default=str))
        return 0
    print(f"recorded {view['scenario']} (policy {view['policy']}, {view['usable_blocks']} usable "
          f"blocks) into {args.out}")
    print("requests (vLLM's own report):")
    for r in view["requests"]:
        stop = f"  [{r['stop_reason']}]" if r.get("stop_reason") else ""
        print(f"  {r['name']:<14} prompt {r['num_prompt_tokens'] // 32:>3} blocks  "
              f"cached {r['num_cached_tokens'] or 0:>5} tokens  finish {r['finish_reason']}{stop}")
    print("claims (reconstructed from the trace):")
    for c in claims:
        print(f"  {c['claim_id']:<16} {c['tenant'] or '-':<16} {c['protection_mode'] or '-':<15} "
              f"{c['outcome']:<19} lost: harm {c['blocks_lost_harm']}, expiry "
              f"{c['blocks_lost_expiry']}, relaxation {c['blocks_lost_relaxation']}, eviction "
              f"{c['blocks_lost_eviction']}")
        if c.get("positions_lost"):
            print(f"  {'':<16} positions lost: {_ranges(c['positions_lost'])} of "
                  f"{c['bound_blocks']} bound blocks")
        if c.get("first_harm_seq") is not None:
            print(f"  {'':<16} first harm at seq {c['first_harm_seq']} by request "
                  f"{c['first_harm_by_request_id']}; value lost {c['value_lost']}")
    print("block losses by label: " + (", ".join(f"{k} {v}" for k, v in losses.items())
                                       or "none"))
    return 0


def _claims_and_losses(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, int]]:
    import queries
    from reconstruct.loader import load_runs

    con = queries.audit(load_runs([run_dir]))
    claims = con.sql("""
        SELECT o.*, p.positions_lost, b.bound_blocks FROM claim_outcomes o
        LEFT JOIN (SELECT run_id, claim_id, list(DISTINCT position ORDER BY position)
                          AS positions_lost FROM loss_claims GROUP BY ALL) p USING (run_id, claim_id)
        LEFT JOIN (SELECT run_id, claim_id, count(DISTINCT position) AS bound_blocks
                   FROM events WHERE event = 'claim_bound' GROUP BY ALL) b USING (run_id, claim_id)
        ORDER BY o.claim_id""").to_arrow_table().to_pylist()
    losses = dict(con.sql("SELECT label, count(*) FROM losses GROUP BY label "
                          "ORDER BY label").fetchall())
    return claims, losses


def _ranges(positions: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    spans: list[list[int]] = []
    for p in positions:
        if spans and p == spans[-1][1] + 1:
            spans[-1][1] = p
        else:
            spans.append([p, p])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


# -- sweep ----------------------------------------------------------------------------------------

def _sweep(args: argparse.Namespace) -> int:
    _quiet_vllm()
    rows = sweep(args.scenario, _ints(args.capacities), _names(args.policies, POLICIES),
                 args.out, model_dir=args.model)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(render_table(rows))
    return 0


def sweep(scenario: str, capacities: list[int], policies: list[str], out: Path, *,
          model_dir: Path | None = None) -> list[dict[str, Any]]:
    """Record every (policy, capacity) point not yet complete, then tabulate them all."""
    from tqdm import tqdm

    from reconstruct.loader import read_manifest
    from recorder.scenarios import record

    out.mkdir(parents=True, exist_ok=True)
    points = [(p, c) for p in policies for c in capacities]
    bar = tqdm(points, desc=f"sweep {scenario}", unit="point", file=sys.stderr)
    for policy, usable in bar:
        run_dir = out / f"{scenario}-{policy}-{usable}"
        bar.set_postfix_str(f"{policy} @ {usable}")
        if _complete(run_dir, read_manifest):
            continue
        shutil.rmtree(run_dir, ignore_errors=True)  # a partial point is recorded again
        record(scenario, usable, policy, run_dir, model_dir=model_dir)
    rows = [{"scenario": scenario, **row}
            for row in sweep_rows([out / f"{scenario}-{p}-{c}" for p, c in points])]
    (out / "sweep.json").write_text(json.dumps({"scenario": scenario, "rows": rows}, indent=2))
    return rows


def sweep_rows(run_dirs: list[Path]) -> list[dict[str, Any]]:
    """One row per run directory, every number decided by the reconstructor."""
    import queries
    from reconstruct.loader import load_runs

    rel = queries.audit(load_runs(run_dirs)).sql(f"SELECT {', '.join(SWEEP_COLUMNS)} FROM capacity_sweep "
                         "ORDER BY policy, usable_blocks")
    return rel.to_arrow_table().to_pylist()


def render_table(rows: list[dict[str, Any]]) -> str:
    """The sweep as a fixed-width text table."""
    header = ("policy", "usable", "active", "resident lost", "claim", "shortfall", "blocking",
              "harm", "expiry", "relax", "evict", "unknown")
    lines = [header]
    for r in rows:
        lines.append((r["policy"], str(r["usable_blocks"]), r["active_outcome"] or "-",
                      str(r["resident_blocks_lost"]), r["claim_outcome"] or "-",
                      "-" if r["shortfall_blocks"] is None else str(r["shortfall_blocks"]),
                      ",".join(r["blocking_claim_ids"] or []) or "-", str(r["harm"]),
                      str(r["expiry"]), str(r["relaxation"]), str(r["eviction"]),
                      str(r["unknown"])))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)) for line in lines)


def _complete(run_dir: Path, read_manifest: Any) -> bool:
    try:
        return bool(read_manifest(run_dir).get("complete"))
    except InputError:
        return False


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"--capacities must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 2:
        raise InputError("--capacities needs at least one value, each at least 2")
    return values


def _names(text: str, known: dict[str, Any]) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise InputError(f"unknown policies {unknown}; choose from {sorted(known)}")
    return names
